"""Every file a user hands in, read and checked one way before anything runs: workloads, catalogs, calibration files,
campaign files, serve templates, KV scales files, queue entries.

- read(): a regular file only (a FIFO, a device or a link to one is refused, never opened for a blocking read), at
  most a size, UTF-8 text without NUL bytes; YAML without aliases and nested at most MAX_DEPTH levels (a 1 kB alias
  bomb is refused, not expanded; 3,000 brackets are one line, not a RecursionError), or JSON / JSON lines nested as
  deep at most.
- check(): the file's pydantic schema, with the bounds the command-line options have (bench/checks.py: tokens,
  counts, ports, GPUs; every float finite unless a schema says otherwise).
Every problem is one line naming the file, the key and the value; BadInput carries all of them, the CLI prints them
and exits 2. This module imports nothing of the project but bench.errors and bench.checks, so every part (loadgen
included) checks its files with it.
"""

from __future__ import annotations

import json
import os
import re
import stat
from pathlib import Path
from typing import Annotated, TypeVar

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from bench.checks import GPUS_MAX, INT_MAX, PORT_MAX, TOKENS_MAX, USERS_MAX
from bench.errors import BadInput

MAX_BYTES = 1 << 20  # a YAML file a person writes is a page or two; 1 MiB is far beyond any
MAX_DEPTH = 24  # nesting levels: the deepest schema (a campaign) needs five
M = TypeVar("M", bound=BaseModel)


class Schema(BaseModel):
    """A file's schema: unknown keys are refused (a typo is a line, not a silently ignored setting), floats finite."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False, frozen=True, validate_default=True)


# the options' bounds as schema types (bench/cli/checks.py LIMITS)
Tokens = Annotated[int, Field(ge=1, le=TOKENS_MAX)]
TokensOrZero = Annotated[int, Field(ge=0, le=TOKENS_MAX)]
Count = Annotated[int, Field(ge=1, le=USERS_MAX)]
CountOrZero = Annotated[int, Field(ge=0, le=USERS_MAX)]
Gpus = Annotated[int, Field(ge=1, le=GPUS_MAX)]
Port = Annotated[int, Field(ge=1, le=PORT_MAX)]
Seed = Annotated[int, Field(ge=0, le=2**32 - 1)]
Whole = Annotated[int, Field(ge=0, le=INT_MAX)]
Positive = Annotated[float, Field(gt=0, le=1e12, allow_inf_nan=False)]
NonNegative = Annotated[float, Field(ge=0, le=1e12, allow_inf_nan=False)]
Fraction = Annotated[float, Field(gt=0, le=1, allow_inf_nan=False)]
Text = Annotated[str, Field(max_length=4096)]


def regular_file(path: str | Path, what: str, max_bytes: int = MAX_BYTES) -> bytes:
    """The bytes of a regular file of at most max_bytes, or BadInput: no such file, not a regular file (FIFO, device,
    directory; a link is judged by what it points to), too large, unreadable."""
    p = Path(path)
    try:  # O_NONBLOCK: opening a FIFO returns at once instead of waiting for a writer
        fd = os.open(p, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        raise BadInput(f"{p}: no such {what} file") from None
    except OSError as e:
        raise BadInput(f"{p}: the {what} file cannot be read ({e.strerror or type(e).__name__})") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise BadInput(f"{p}: not a regular file ({_kind(st.st_mode)}); a {what} is a file of text")
        if st.st_size > max_bytes:
            raise BadInput(f"{p}: {st.st_size:,} bytes; a {what} file is at most {_size(max_bytes)}")
        chunks, left = [], max_bytes + 1
        while left > 0 and (chunk := os.read(fd, min(left, 1 << 20))):
            chunks.append(chunk)
            left -= len(chunk)
        data = b"".join(chunks)
    except OSError as e:
        raise BadInput(f"{p}: the {what} file cannot be read ({e.strerror or type(e).__name__})") from None
    finally:
        os.close(fd)
    if len(data) > max_bytes:  # grew while being read
        raise BadInput(f"{p}: more than {_size(max_bytes)}; a {what} file is at most that")
    return data


def read(path: str | Path, what: str, fmt: str | None = None, max_bytes: int = MAX_BYTES) -> object:
    """The document in a user's file (fmt yaml | json | jsonl; by default from the suffix: .json, .jsonl, else
    YAML), or BadInput in one line."""
    p = Path(path)
    fmt = fmt or {".json": "json", ".jsonl": "jsonl"}.get(p.suffix.lower(), "yaml")
    return parse(regular_file(p, what, max_bytes), str(p), what, fmt, max_bytes)


def parse(data: bytes | str, source: str, what: str, fmt: str = "yaml", max_bytes: int = MAX_BYTES) -> object:
    """The document in `data` (text given inline, e.g. a page's upload), read with read()'s limits."""
    if len(data) > max_bytes:
        raise BadInput(f"{source}: {len(data):,} bytes; a {what} file is at most {_size(max_bytes)}")
    if isinstance(data, bytes):
        try:
            data = data.decode("utf-8")
        except UnicodeDecodeError as e:
            raise BadInput(f"{source}: not UTF-8 text (byte {e.start}); a {what} is a {fmt.upper()} file") from None
    if "\x00" in data:
        raise BadInput(f"{source}: a binary file (NUL bytes); a {what} is a {fmt.upper()} file")
    if fmt == "yaml":
        try:
            return yaml.load(data, Loader=_Loader)  # noqa: S506 (a SafeLoader)
        except yaml.YAMLError as e:
            raise BadInput(f"{source}: not a {what} YAML ({str(e).splitlines()[0]})") from None
    if fmt == "jsonl":
        return [_json(line, f"{source}: line {i}", what) for i, line in enumerate(data.splitlines(), 1)
                if line.strip()]
    return _json(data, source, what)


_TOKENS = re.compile(r'"(?:[^"\\]|\\.)*"|[\[\]{}]')


def _json(text: str, source: str, what: str) -> object:
    depth = deepest = 0
    for m in _TOKENS.finditer(text):  # the nesting, counted before json's recursive parser sees it
        c = m.group()
        if c in "[{":
            depth += 1
            deepest = max(deepest, depth)
            if deepest > MAX_DEPTH:
                raise BadInput(f"{source}: not a {what} JSON (nested deeper than {MAX_DEPTH} levels)")
        elif c in "]}":
            depth -= 1
    try:
        return json.loads(text, parse_constant=_no_constant)
    except (ValueError, RecursionError) as e:
        raise BadInput(f"{source}: not a {what} JSON ({str(e).splitlines()[0][:200]})") from None


def _no_constant(name: str) -> float:
    raise ValueError(f"{name} is not a finite number")


class _Loader(yaml.SafeLoader):
    """SafeLoader that refuses aliases (no expansion at all) and nesting past MAX_DEPTH (no RecursionError)."""

    depth = 0

    def compose_node(self, parent, index):  # noqa: ANN001, ANN201 (PyYAML's signature)
        if self.check_event(yaml.AliasEvent):
            mark = self.peek_event().start_mark
            raise yaml.YAMLError(f"aliases (*name) are not accepted (line {mark.line + 1})")
        self.depth += 1
        if self.depth > MAX_DEPTH:
            raise yaml.YAMLError(f"nested deeper than {MAX_DEPTH} levels")
        try:
            return super().compose_node(parent, index)
        finally:
            self.depth -= 1


def problems(schema: type[M], data: object, where: str = "") -> tuple[M | None, list[str]]:
    """(the data as the schema, []) or (None, one line per problem: `key.path: what, got VALUE`)."""
    try:
        return schema.model_validate(data), []
    except ValidationError as e:
        return None, [_line(err, where, schema) for err in e.errors(include_url=False)]


def check(schema: type[M], data: object, source: str, where: str = "") -> M:
    """The data as the schema, or BadInput with one line per problem, each naming `source`."""
    model, wrong = problems(schema, data, where)
    if wrong:
        raise BadInput("\n".join(f"{source}: {w}" for w in wrong))
    return model


def load(schema: type[M], path: str | Path, what: str, fmt: str | None = None, max_bytes: int = MAX_BYTES) -> M:
    """read() then check(): a user's file as its schema, or BadInput."""
    return check(schema, read(path, what, fmt, max_bytes), str(path))


def _line(err: dict, where: str, schema: type[BaseModel]) -> str:
    loc = ".".join(str(p) for p in err["loc"] if p != "")  # a list index 0 is a place too
    key = ".".join(k for k in (where, loc) if k) or "(top)"
    msg = err["msg"].removeprefix("Value error, ")
    if err["type"] == "extra_forbidden":
        known = f" (known: {', '.join(sorted(schema.model_fields))})" if len(err["loc"]) == 1 else ""
        return f"{key}: unknown key{known}"
    if err["type"] == "missing":
        return f"{key}: required"
    got = err.get("input")
    if isinstance(got, dict | list):  # a rule across the keys of a mapping: the message names their values
        return f"{key}: {msg}"
    return f"{key}: {msg}, got {repr(got)[:120]}"


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISDIR, "a directory"), (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return name
    return "not a regular file"


def _size(n: int) -> str:
    return f"{n // (1 << 20)} MiB" if n >= 1 << 20 else f"{n // 1024} kB"
