"""A twin for one load-test run, in a process of its own (the load generator's event loop stays the load
generator's): `python -m bench.twin_proc SPEC` prints {"url": ...} and serves until its stdin closes."""

from __future__ import annotations

import json
import sys

from bench.errors import BadInput


def main() -> None:
    from bench.twin import parse_twin_spec, serve_in_thread

    try:
        handle = serve_in_thread(parse_twin_spec(sys.argv[1]))
    except BadInput as e:
        print(json.dumps({"error": str(e)}), flush=True)
        sys.exit(2)
    print(json.dumps({"url": handle.url}), flush=True)
    sys.stdin.read()
    handle.close()


if __name__ == "__main__":
    main()
