"""The typer app: one thin function per command. Bad input ends in one line on stderr and exit 2."""

from __future__ import annotations

import sys

import typer

from bench.errors import BadInput

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False, help="Capacity planning for MoE models on SGLang.")


def main() -> None:
    try:
        app(standalone_mode=True)
    except BadInput as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
