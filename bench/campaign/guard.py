"""What a campaign file may hold, checked before anything runs: YAML read with limits (size, nesting, no aliases:
a 1 kB "billion laughs" file is refused, not expanded), every number finite and within a range a run can use, URLs
that parse and carry no credentials, launch templates whose placeholders are known, workload files readable and
of their format, and every value that reaches a launch command one word without shell characters (SGLang's
flags themselves are parsed in bench/campaign/flags.py).

Who may launch what (the trust model, docs/campaigns.md): `capbench campaign FILE` is the user's own command, so a
template written in the file runs. `capbench serve` takes files from anyone who can open its page or write its queue
folder, so there a campaign names one of the templates the operator gave at start (`--templates FILE`) and may carry
no shell command of its own; without that file it runs twins and URLs only.
"""

from __future__ import annotations

import math
import re
import string
from pathlib import Path
from urllib.parse import urlsplit

from bench import files

MAX_BYTES = 256 * 1024  # a campaign is a page of YAML; anything larger is not one
PLACEHOLDERS = ("command", "port", "host", "python", "image")
# the SGLang interpreter (a path or a name on PATH) and a container image: filled into a template's shell command,
# so only these characters; the interpreter may not start with "-" (an option to the shell's command)
INTERPRETER = re.compile(r"^[A-Za-z0-9_./+][A-Za-z0-9_./+-]{0,299}$")
IMAGE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._/:@+-]{0,299}$")
# campaign key -> the highest value accepted (the lowest is checked where the key is read: positive, an int, ...)
HIGHEST = {"duration": 1e6, "health_timeout": 7 * 86400, "rate": 1e6, "users": 100_000, "start": 1e6, "factor": 100,
           "max_stages": 1000, "refine": 30, "min_gain": 10, "port": 65535, "tp": 4096, "dp": 4096, "ep": 4096,
           "gpus": 4096, "count": 256, "bootstrap_port": 65535}
# SGLang's arguments whose value is a secret: given as env:NAME, filled in from the environment inside the server's
# process (engine_patches/launch.py), so no file, log, report or `ps` line holds it
SECRET_FLAGS = ("--api-key", "--admin-api-key", "--hf-token", "--ssl-keyfile-password")
# Every word capbench fills into a launch template (a value the campaign gives: model path, scales path, flags, and
# what capbench adds): only characters no shell reads specially, so the command line stays the same words however
# many shells it passes through (ssh joins its arguments and hands them to the remote shell; `bash -c '{command}'`
# expands it again). No quoting can be right for every template; a word without specials needs none.
WORD = re.compile(r"^[A-Za-z0-9_@%+=:,./-]+$")
HOST = re.compile(r"^[A-Za-z0-9][A-Za-z0-9.:-]{0,252}$")


def read_yaml(data: bytes | str, source: str) -> object:
    """The YAML document in `data`, or BadInput in one line: too large, not UTF-8, not YAML, aliases, too deep
    (bench/files.py, the one reader of users' files)."""
    return files.parse(data, source, "campaign", "yaml", MAX_BYTES)


def read_file(path: str | Path, what: str = "campaign") -> bytes:
    """A campaign (or templates) file's bytes: a regular file of at most MAX_BYTES (a FIFO or /dev/zero is refused
    without being read), or BadInput."""
    return files.regular_file(path, what, MAX_BYTES)


def check_ranges(problems: list, where: str, raw: object) -> None:
    """Every number under a known key finite and at most HIGHEST (below the lowest is said where the key is read)."""
    if isinstance(raw, list):
        for i, item in enumerate(raw):
            check_ranges(problems, f"{where}[{i}]", item)
        return
    if not isinstance(raw, dict):
        return
    for key, value in raw.items():
        at = f"{where}.{key}" if where else str(key)
        if isinstance(value, dict | list):
            check_ranges(problems, at, value)
            continue
        if key not in HIGHEST or isinstance(value, bool):
            continue
        try:
            v = float(value)
        except (TypeError, ValueError):
            continue  # not a number: said where the key is read
        high = HIGHEST[key]
        if not math.isnan(v) and (math.isinf(v) or v > high):
            problems.append(f"{at}: {value!r} is out of range (at most {high:g})")


def check_finite(config: object, highest: dict[str, float]) -> list[str]:
    """Problems with a parsed spec's numbers (a dataclass): each finite, and at most `highest` where given."""
    from dataclasses import fields

    out = []
    for f in fields(config):
        v = getattr(config, f.name)
        if isinstance(v, float) and (not math.isfinite(v) or v > highest.get(f.name, math.inf)):
            out.append(f"{f.name}={v:g} is out of range" + (f" (at most {highest[f.name]:g})"
                                                            if f.name in highest else " (not finite)"))
    return out


def check_url(url: str) -> str | None:
    """What is wrong with a deployment's URL, or None: it parses, has a host and a valid port, no credentials."""
    from bench.checks import key_in_url, without_credentials

    if without_credentials(url) != url:
        return "credentials in the URL would be stored with the campaign and its runs; the server's key goes in " \
               "an environment variable"
    if (where := key_in_url(url)) is not None:
        return f"{where} would be stored with the campaign and its runs like credentials; the server's key goes " \
               "in an environment variable"
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as e:
        return f"not a URL ({e}): {url[:80]!r}"
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return f"expected http://HOST:PORT, got {url[:80]!r}"
    if port == 0:
        return f"port 0 in {url[:80]!r}"
    return None


def check_template_text(text: str) -> str | None:
    """What is wrong with a template command, or None: placeholders are PLACEHOLDERS only."""
    try:
        fields = [f for _, f, _, _ in string.Formatter().parse(text) if f is not None]
    except ValueError as e:
        return f"{e} (write {{{{ and }}}} for a literal brace)"
    unknown = sorted({f or "{}" for f in fields if f not in PLACEHOLDERS})
    if unknown:
        return f"unknown placeholder(s) {', '.join(unknown)} (known: {', '.join(PLACEHOLDERS)})"
    return None


def check_runtime(key: str, value: object) -> str | None:
    """What is wrong with a `python:` (the SGLang interpreter) or `image:` (a container image) value, or None."""
    pattern, what = (INTERPRETER, "a path or name of a Python interpreter, e.g. /opt/sglang/.venv/bin/python") \
        if key == "python" else (IMAGE, "a container image, e.g. lmsysorg/sglang:v0.5.3-cu129")
    if not isinstance(value, str) or not pattern.match(value):
        return f"{what} is required (letters, digits, . _ / + - {'' if key == 'python' else ': @ '}only), " \
               f"got {str(value)[:80]!r}"
    return None


def check_word(value: object) -> str | None:
    """What is wrong with a value that reaches a launch command, or None: a word of WORD's characters only."""
    text = str(value)
    if WORD.match(text):
        return None
    bad = "".join(sorted({c for c in text if not WORD.match(c)}))[:20] if text else ""
    # the value itself is not repeated: it may be a secret
    return (f"{'characters a shell would read: ' + repr(bad) if bad else 'an empty value'}; a launch value is one "
            "word of letters, digits and _ @ % + = : , . / - (it passes through the launch template's shell, and "
            "through ssh's remote shell)")


def check_words(problems: list, where: str, values: list) -> None:
    """Each of `values` a WORD, its problem one line under `where`."""
    for value in values:
        if (wrong := check_word(value)) is not None:
            problems.append(f"{where}: {wrong}")


def check_host(value: object) -> str | None:
    """What is wrong with a template's host (filled into {host} and the deployment's URL), or None."""
    if isinstance(value, str) and HOST.match(value):
        return None
    return f"a host name or address is required (letters, digits, . : -), got {str(value)[:80]!r}"


def check_workload_file(path: str) -> str | None:
    """What is wrong with a workload file a load names, or None: readable, and a workload YAML or ShareGPT JSON."""
    from loadgen import workloads

    try:
        workloads.load(path).check()
    except workloads.WorkloadError as e:
        return str(e)
    except OSError as e:
        return f"{path} cannot be read ({e.strerror or type(e).__name__})"
    return None


def campaign_path(name: str, root: Path) -> Path | None:
    """The campaign file a command line names: a path (as given, or relative to the checkout, so that
    `capbench campaign data/campaigns/kv-study.yaml` works from any folder), or a built-in name."""
    p = Path(name)
    looks_like_path = "/" in name or p.suffix in (".yaml", ".yml")
    for candidate in ([p, root / p] if looks_like_path else [p, root / "data" / "campaigns" / f"{name}.yaml"]):
        try:
            if candidate.exists() and not candidate.is_dir():  # a FIFO or a device: read_file says what it is
                return candidate
        except OSError:  # a name too long for the file system
            return None
    return None
