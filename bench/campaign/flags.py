"""A campaign's SGLang flags, parsed the way the server will parse them, not matched by spelling.

SGLang's launch builds an argparse parser from ServerArgs.add_cli_args, which resolves abbreviations: `--api-ke K`
sets api_key, `--disaggregation-mo decode` sets disaggregation_mode. So each role's flags go through the same
options (SGLang 0.5.23's table, data/sglang/server-args-0.5.23.json, checked against the real parser by
tests/bench/campaign/test_flags.py) on an argparse parser, and the fields they set decide: a field the campaign's
own keys set is refused, a secret field is accepted only as env:NAME (filled in inside the server's process by
`capbench sglang-launch`), a flag must be written in full (what the launcher and the logs match on), and
`--config FILE` (fields capbench cannot see) is refused.
"""

from __future__ import annotations

import argparse
import json
from functools import cache
from pathlib import Path

TABLE = Path(__file__).resolve().parents[2] / "data" / "sglang" / "server-args-0.5.23.json"
SECRET_FIELDS = ("api_key", "admin_api_key", "ssl_keyfile_password")
REFUSED_FIELDS = {"help": "prints SGLang's help and exits", "config": "reads fields from a file capbench cannot check",
                  "version": "prints SGLang's version and exits"}
# the fields the campaign's keys set (bench/campaign/launch.py, pd_launch.py): a flag may not set them a second time
OWN = ("model_path", "tp_size", "dp_size", "ep_size", "kv_cache_dtype", "port", "host")
PD_OWN = (*OWN, "disaggregation_mode", "disaggregation_transfer_backend", "disaggregation_bootstrap_port", "nnodes",
          "node_rank", "dist_init_addr")
# sglang-router's (launch_router) arguments capbench writes; its other flags are matched by prefix, as argparse does
ROUTER_OWN = ("--pd-disaggregation", "--prefill", "--decode", "--host", "--port")
ROUTER_SECRET_WORDS = ("key", "token", "password", "secret")


class _Refused(Exception):
    pass


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # noqa: ANN201 (argparse's signature)
        raise _Refused(message)


@cache
def _options() -> tuple[_Parser, dict[str, str]]:
    """SGLang's launch parser (every field left out of the namespace unless given) and option string -> field."""
    parser = _Parser(prog="sglang serve", add_help=False, argument_default=argparse.SUPPRESS)
    by_option = {}
    for o in json.loads(TABLE.read_text())["options"]:
        takes = o["takes"]
        if takes == 0:
            parser.add_argument(*o["options"], dest=o["dest"], action="store_true")
        else:
            parser.add_argument(*o["options"], dest=o["dest"], nargs=None if takes == 1 else takes)
        by_option.update({s: o["dest"] for s in o["options"]})
    return parser, by_option


def check_server_flags(problems: list, where: str, flags: list[str], own: tuple[str, ...] = OWN) -> None:
    """Problems with a prefill, decode or colocated server's flags, one line each under `where`."""
    parser, by_option = _options()
    try:
        given = vars(parser.parse_args(flags))
    except _Refused as e:
        said = str(e)
        if said.startswith("unrecognized arguments"):  # names only: a stray value may be a secret
            said = "it takes no " + ", ".join(sorted({f.split("=")[0].split()[0][:60] if f.startswith("-") and
                                                       f.strip() else "value at this place" for f in flags
                                                       if f not in by_option and not f.startswith("env:")}))
        said = said if len(said) <= 160 else said[:157].rsplit(",", 1)[0] + ", ..."
        problems.append(f"{where}: SGLang 0.5.23 would refuse these flags ({said})")
        return
    said = set()
    for field, value in given.items():
        said.add(field)
        if field in REFUSED_FIELDS:
            problems.append(f"{where}: {_spelled(flags, field, by_option)} {REFUSED_FIELDS[field]}; refused")
        elif field in own:
            problems.append(f"{where}: {_spelled(flags, field, by_option)} sets {field}, which the campaign's own "
                            "keys set; use those")
        elif field in SECRET_FIELDS and not _env_ref(value):
            problems.append(f"{where}: {_spelled(flags, field, by_option)} takes env:NAME ({field} is a secret: "
                            "name the environment variable holding it); a secret written in the campaign would be "
                            "stored, logged and reported")
        else:
            said.discard(field)
    for flag in flags:
        name = flag.split("=", 1)[0]
        full = sorted(s for s in by_option if s.startswith(name))[:1] or ["option"]
        if name.startswith("--") and name not in by_option and by_option.get(full[0]) not in said:
            problems.append(f"{where}: {name} is SGLang's {full[0]} abbreviated; write it in full")


def check_router_flags(problems: list, where: str, flags: list[str]) -> None:
    """Problems with the router's flags: none may set (or abbreviate) what capbench writes, or carry a secret
    (capbench fills env:NAME in for SGLang's servers, not for the router)."""
    for flag in flags:
        name = flag.split("=", 1)[0]
        if not name.startswith("-"):
            continue
        if any(o.startswith(name) for o in ROUTER_OWN):
            problems.append(f"{where}: {name} is set by the campaign's own keys; use those")
        elif any(w in name.lower() for w in ROUTER_SECRET_WORDS):
            problems.append(f"{where}: {name} looks like a secret; the router's secrets are not taken from a "
                            "campaign (put them in the operator's template's environment)")


def secret_env(flags: list[str], field: str = "api_key") -> str | None:
    """The environment variable a server's `field` (its API key) is given by, if the flags name one."""
    try:
        value = vars(_options()[0].parse_args(flags)).get(field)
    except _Refused:
        return None
    return value[4:] if _env_ref(value) else None


def _env_ref(value: object) -> bool:
    return isinstance(value, str) and value.startswith("env:") and value[4:].isidentifier()


def _spelled(flags: list[str], field: str, by_option: dict[str, str]) -> str:
    """How the flags wrote the option that set `field` (an abbreviation as given)."""
    for flag in flags:
        name = flag.split("=", 1)[0]
        if name.startswith("-") and (by_option.get(name) == field or
                                     {by_option[s] for s in by_option if s.startswith(name)} == {field}):
            return name
    return field
