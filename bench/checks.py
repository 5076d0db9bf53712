"""Checks of what a user typed, before any work starts: target URLs, numbers (finite, in range) and paths (resolved
once against the current directory; outputs that cannot be written refused). Each failure is one BadInput line."""

from __future__ import annotations

import ipaddress
import math
import re
import socket
from pathlib import Path
from urllib.parse import unquote, urlsplit

from bench.errors import BadInput

INT_MAX = 2**31 - 1
# the bounds options and user files share (bench/cli/checks.py LIMITS, bench/files.py's schema types)
PORT_MAX = 65535
GPUS_MAX = 4096
USERS_MAX = 100_000
TOKENS_MAX = 1 << 24  # tokens of one prompt or answer: far past any model's context


def check_target(url: str, flag: str = "--target") -> str:
    """An http(s) URL with a host and a usable port; returns it without a trailing slash."""
    if without_credentials(url) != url:
        raise BadInput(f"{flag} {without_credentials(url)!r}: credentials in the URL would be stored with the run "
                       "and shown by ps; put the key in an environment variable and pass --api-key-env NAME")
    if (where := key_in_url(url)) is not None:
        raise BadInput(f"{flag} {_origin(url)}: {where} would be stored with the run and shown by ps like "
                       "credentials; put the key in an environment variable and pass --api-key-env NAME")
    try:
        parts = urlsplit(url)
        port = parts.port  # raises on a port out of range or not a number
        host = parts.hostname
    except ValueError as e:
        raise BadInput(f"{flag} {url!r} is not a usable URL ({e})") from None
    if parts.scheme not in ("http", "https") or not host:
        raise BadInput(f"{flag} is a URL (http://HOST:PORT), not {url!r}")
    if port == 0:
        raise BadInput(f"{flag} {url!r}: port 0 cannot be connected to")
    if "[" in parts.netloc:
        try:
            ipaddress.IPv6Address(host.split("%")[0])
        except ValueError:
            raise BadInput(f"{flag} {url!r}: {host!r} is not an IPv6 address") from None
    return url.rstrip("/")


def without_credentials(url: str) -> str:
    """The URL with any user:password@ removed (for anything shown or stored); a password may hold a `/`, so the
    credentials end at the last @ before any query."""
    head, sep, rest = url.partition("://")
    if not sep:
        return url
    before_query = rest.split("?")[0].split("#")[0]
    return f"{head}://{rest[before_query.rfind('@') + 1:]}" if "@" in before_query else url


# a query or path part named like this holds a key; a path segment this long of letters and digits looks like one
_KEY_WORDS = ("key", "token", "secret", "passw", "auth", "credential", "bearer", "signature")
_KEY_LIKE = re.compile(r"^(?=.*[A-Za-z])(?=.*[0-9])[A-Za-z0-9_\-+/=.~]{20,}$|^(sk|pk|hf|ghp|xox[a-z])[-_]", re.I)


def key_in_url(url: str) -> str | None:
    """Where a URL would carry a key, or None: any query or fragment (an OpenAI-compatible server needs none), or
    a path segment named like a key or shaped like one. The URL itself is not repeated: it holds the key."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return None  # said by the caller's parse
    if parts.query or parts.fragment or url.rstrip().endswith(("?", "#")):
        return "a query or fragment (?... #...)"
    for seg in unquote(parts.path).split("/"):
        if any(w in seg.lower() for w in _KEY_WORDS) or _KEY_LIKE.search(seg):
            return "a path segment that looks like a key"
    return None


def _origin(url: str) -> str:
    try:
        parts = urlsplit(without_credentials(url))
        return f"{parts.scheme}://{parts.netloc}"
    except ValueError:
        return "(the URL)"


def env_seconds(name: str, default: float, low: float, high: float) -> float:
    """A duration from the environment: seconds from `low` to `high`, or `default` when unset; BadInput in one line
    otherwise (nan, inf, negative, not a number: a hung stop command would never be killed)."""
    import os

    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and low <= value <= high):
        raise BadInput(f"{name}={raw[:40]!r}: seconds from {low:g} to {high:g} are required")
    return value


def check_host(host: str, flag: str) -> None:
    """A host name or address that resolves (an unresolvable one would be retried for minutes)."""
    try:
        socket.getaddrinfo(host, None)
    except (OSError, UnicodeError, ValueError) as e:
        raise BadInput(f"{flag} {host!r} does not resolve ({e})") from None


def number(flag: str, value: float | int, low: float | None = None, high: float | None = None,
           above: bool = False, allow_inf: bool = False) -> None:
    """`value` is finite (or +inf where allowed) and within [low, high] (low excluded when `above`)."""
    if isinstance(value, float) and math.isnan(value):
        raise BadInput(f"{flag} must be a number, not nan")
    if isinstance(value, float) and math.isinf(value) and not (allow_inf and value > 0):
        raise BadInput(f"{flag} must be finite, not {value}")
    if low is not None and (value <= low if above else value < low):
        raise BadInput(f"{flag} must be {'>' if above else '>='} {low:g}, not {value:g}")
    if high is not None and value > high and not (allow_inf and math.isinf(value)):
        raise BadInput(f"{flag} must be <= {high:g}, not {value:g}")


def input_file(flag: str, path: str) -> str:
    """An existing file, as an absolute path."""
    p = Path(path).expanduser().resolve()
    if not p.is_file():
        raise BadInput(f"{flag} {path!r}: no such file")
    return str(p)


def name_or_file(path: str) -> str:
    """A built-in name stays as it is; a path to an existing file becomes absolute (the same file in every
    process, whatever its working directory)."""
    p = Path(path).expanduser()
    return str(p.resolve()) if p.is_file() else path


def output_file(flag: str, path: str, overwrite: bool = True) -> str:
    """A file to write: not a directory, its parent creatable; as an absolute path."""
    p = Path(path).expanduser().resolve()
    if p.is_dir():
        raise BadInput(f"{flag} {path!r} is a directory; give a file name")
    if p.exists() and not overwrite:
        raise BadInput(f"{flag} {path!r} exists already")
    _parent(flag, p)
    return str(p)


def output_dir(flag: str, path: str) -> str:
    """A directory to write into (made if missing): not an existing file; as an absolute path."""
    p = Path(path).expanduser().resolve()
    if p.exists() and not p.is_dir():
        raise BadInput(f"{flag} {path!r} is a file, not a directory")
    _parent(flag, p)
    return str(p)


def _parent(flag: str, p: Path) -> None:
    for q in p.parents:
        if q.exists():
            if not q.is_dir():
                raise BadInput(f"{flag} {str(p)!r}: {str(q)!r} is a file, not a directory")
            return
