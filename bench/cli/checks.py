"""The limits of every number a command takes, and the paths it is given, checked before the command runs: a NaN,
an infinity, a negative count or a value no machine could hold is one line and exit 2, never a traceback or a
silent default. Paths are resolved here, once, against the current directory."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from pathlib import Path

from bench import checks
from bench.checks import GPUS_MAX, INT_MAX, PORT_MAX, TOKENS_MAX, USERS_MAX
from bench.errors import BadInput

PORT = {"low": 1, "high": PORT_MAX}
COUNT = {"low": 1, "high": INT_MAX}
GPUS = {"low": 1, "high": GPUS_MAX}
# option name -> bounds of bench.checks.number; (command, option) overrides a name's meaning in one command
LIMITS: dict[str | tuple[str, str], dict] = {
    "tp": GPUS, "dp": GPUS, "ep": GPUS, "tp_size": GPUS,
    "context": COUNT, "page_size": {"low": 1, "high": 1 << 20}, "mem_fraction": {"low": 0, "high": 1, "above": True},
    "rate": {"low": 0, "high": 1e6, "above": True}, "target_rate": {"low": 0, "high": 1e6, "above": True},
    ("simulate", "rate"): {"low": 0, "high": 1e4, "above": True, "allow_inf": True},
    "users": {"low": 1, "high": USERS_MAX}, "duration": {"low": 0, "high": 1e6, "above": True},
    ("demo", "duration"): {"low": 0, "high": 3600, "above": True},
    "warmup": {"low": 0, "high": 1e5}, "timeout": {"low": 0, "high": 1e5, "above": True},
    "workers": {"low": 0, "high": 256}, ("plan", "workers"): {"low": 1, "high": 256},
    ("quantize_int4", "workers"): {"low": 1, "high": 256}, ("quantize_experts", "workers"): {"low": 1, "high": 256},
    "expect_workers": {"low": 0, "high": 4096},
    "master_port": PORT, "port": PORT, ("twin", "port"): {"low": 0, "high": 65535},
    "seed": {"low": 0, "high": 2**32 - 1},
    "max_inflight": {"low": 1, "high": 100_000}, "max_concurrency": {"low": 1, "high": 100_000},
    "num_requests": {"low": 1, "high": 10_000_000},
    "min_seconds": {"low": 0, "high": 1e6}, "rounds": {"low": 1, "high": 1000},
    "input_len": COUNT, "output_len": COUNT, "price": {"low": 0, "high": 1e6, "above": True},
    "time_scale": {"low": 0, "high": 1e6, "above": True}, "drift": {"low": 0, "high": 1},
    "max_total_tokens": COUNT, "concurrency": {"low": 1, "high": 1024},
    "max_mean_kl": {"low": 0, "high": 1e6}, "min_token_agreement": {"low": 0, "high": 1},
    "min_exact_match": {"low": 0, "high": 1}, "margin": {"low": 0, "high": 1e3, "above": True},
    "num_layers": {"low": 1, "high": 100_000}, "max_tokens": {"low": 1, "high": TOKENS_MAX},
    "group_size": {"low": 1, "high": 1 << 16}, "kv_scrub_pages_per_s": {"low": 0, "high": 1e9},
    "limit": {"low": 1, "high": 1_000_000}, "max_drop": {"low": 0, "high": 100},
}
OUTPUT_DIRS = {("export", "out"), ("quantize_int4", "out"), ("quantize_experts", "out")}
FILE_OR_NAME = ("workload", "profile", "calibration", "prompts")


def checked(command: Callable) -> Callable:
    """The command, its numbers checked against LIMITS and its paths resolved before its body runs."""
    name = command.__name__
    sig = inspect.signature(command)

    @functools.wraps(command)
    def run(*args, **kwargs):
        bound = sig.bind_partial(*args, **kwargs)
        numbers_first = sorted(bound.arguments.items(), key=lambda kv: not isinstance(kv[1], int | float))
        for key, value in numbers_first:
            bound.arguments[key] = check(name, key, value)
        return command(*bound.args, **bound.kwargs)

    return run


def check(command: str, key: str, value: object) -> object:
    """One option's value, checked; paths come back absolute."""
    flag = "--" + key.replace("_", "-")
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, int | float):
        limits = LIMITS.get((command, key), LIMITS.get(key))
        if limits is None:
            if isinstance(value, float):
                checks.number(flag, value)  # finite, at least
            elif not -INT_MAX <= value <= INT_MAX:
                raise BadInput(f"{flag} {value} is out of range")
        else:
            checks.number(flag, value, **limits)
        return value
    if not isinstance(value, str | list):
        return value
    try:
        return _path(command, key, flag, value)
    except (OSError, ValueError, RuntimeError) as e:  # too long, a NUL byte, ~nosuchuser
        if isinstance(e, BadInput):
            raise
        raise BadInput(f"{flag} {str(value)[:80]!r}: not a usable path ({type(e).__name__}: {str(e)[:80]})") from None


def _path(command: str, key: str, flag: str, value: str | list) -> str | list:
    if key == "db":
        if Path(value).is_dir():
            raise BadInput(f"--db {value!r} is a directory; give the DuckDB file")
        return str(Path(value).expanduser().resolve())
    if (key == "out" and command != "sglang_launch") or (command, key) == ("campaign", "report"):
        return checks.output_dir(flag, value) if (command, key) in OUTPUT_DIRS else checks.output_file(flag, value)
    if key == "target":
        return [_twin_paths(v) for v in value] if isinstance(value, list) else _twin_paths(value)
    if key in FILE_OR_NAME:
        return [checks.name_or_file(v) for v in value] if isinstance(value, list) else checks.name_or_file(value)
    return value


def _twin_paths(target: str) -> str:
    """twin:SPEC with a relative calibration=FILE: the file made absolute (the twin runs in its own process)."""
    if not target.startswith("twin:"):
        return target
    parts = target.split(",")
    for i, part in enumerate(parts):
        key, _, value = part.partition("=")
        if key == "calibration" and value:
            parts[i] = f"calibration={checks.name_or_file(value)}"
    return ",".join(parts)
