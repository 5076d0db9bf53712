"""SGLang 0.5.23's own launch parser (ServerArgs.add_cli_args on argparse, as sglang.launch_server builds it),
written down as the option table capbench checks campaign flags with (data/sglang/server-args-0.5.23.json).
`python tests/bench/campaign/sglang_server_args.py` rewrites the table from the SGLang installed beside the tests;
test_flags.py checks the table against that parser."""

import argparse
import importlib.util
import json
import sys
import types
from pathlib import Path

TABLE = Path(__file__).resolve().parents[3] / "data" / "sglang" / "server-args-0.5.23.json"


def sglang_parser() -> argparse.ArgumentParser:
    """The parser sglang.srt.server_args.prepare_server_args builds. SGLang's package __init__ (transformers patches
    that import this CPU venv's mismatched torchvision) is skipped: the parser is in server_args alone."""
    if "sglang" not in sys.modules:
        spec = importlib.util.find_spec("sglang")
        pkg = types.ModuleType("sglang")
        pkg.__path__ = list(spec.submodule_search_locations)
        sys.modules["sglang"] = pkg
    from sglang.srt.server_args import ServerArgs

    parser = argparse.ArgumentParser(prog="sglang serve")
    ServerArgs.add_cli_args(parser)
    return parser


def table(parser: argparse.ArgumentParser) -> list[dict]:
    """Each option's strings, the field it sets, and how many values it takes (0, 1, or argparse's ?, *, +)."""
    out = []
    for a in parser._actions:
        takes = 0 if a.nargs == 0 or isinstance(a, argparse._StoreConstAction | argparse._HelpAction) else \
            (1 if a.nargs is None else a.nargs)
        out.append({"options": list(a.option_strings), "dest": a.dest, "takes": takes})
    return out


if __name__ == "__main__":
    import importlib.metadata

    doc = {"source": "sglang==0.5.23 (PyPI wheel), sglang/srt/server_args.py ServerArgs.add_cli_args",
           "version": importlib.metadata.version("sglang"), "licence": "Apache-2.0",
           "options": table(sglang_parser())}
    head = json.dumps({k: v for k, v in doc.items() if k != "options"})[:-1]
    rows = ",\n".join(json.dumps(o) for o in doc["options"])
    TABLE.write_text(f'{head}, "options": [\n{rows}\n]}}\n')
    print(f"{TABLE}: {len(doc['options'])} options")
