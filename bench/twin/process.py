"""A run's target: a URL, or a twin for one load-test run in a process of its own (the load generator's event
loop stays the load generator's): main() with argv SPEC prints {"url": ...} and serves until its
stdin closes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from bench.errors import BadInput


class Target:
    """The server a run talks to: a URL, or `twin:SPEC`, a twin started (in its own process) for the run."""

    def __init__(self, target: str):
        self.spec, self.proc = None, None
        if not target.startswith("twin:"):
            if not target.startswith(("http://", "https://")):
                raise BadInput(f"--target is a URL (http://HOST:PORT) or twin:SPEC, not {target!r}")
            self.url = target.rstrip("/")
            return
        self.spec = target
        # -c, not -m: bench.twin imports this module, and runpy would run a second copy of it
        self.proc = subprocess.Popen([sys.executable, "-c", "from bench.twin.process import main; main()", target],
                                     stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, cwd=Path(__file__).resolve().parents[2], text=True)
        line = self.proc.stdout.readline()
        try:
            msg = json.loads(line)
        except ValueError:
            msg = {"error": "the twin did not start"}
        if "url" not in msg:
            self.close()
            raise BadInput(msg.get("error", "the twin did not start"))
        self.url = msg["url"].rstrip("/")

    def close(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.stdin.close()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def main() -> None:
    from bench.twin.config import parse_twin_spec
    from bench.twin.serve import own_process, serve_in_thread

    own_process()
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
