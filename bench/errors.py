"""The one error a user sees: a single line on stderr and exit code 2."""


class BadInput(ValueError):
    """Input the user can fix: unknown ids, impossible parallelism, a model that does not fit."""
