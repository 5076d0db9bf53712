"""`capbench serve` creates its queue folder (`<db folder>/campaign-queue/`), so an operator can copy a campaign
file into the folder it names at start, before anything was ever queued on the page."""

import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

CAPBENCH = str(Path(sys.executable).parent / "capbench")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_serve_creates_the_queue_folder_it_names(tmp_path):
    db = tmp_path / "fresh" / "c.duckdb"
    queue = tmp_path / "fresh" / "campaign-queue"
    log = tmp_path / "serve.log"
    with log.open("w") as out:
        proc = subprocess.Popen([CAPBENCH, "serve", "--db", str(db), "--port", str(_free_port())], stdout=out,
                                stderr=subprocess.STDOUT, cwd=tmp_path)
    try:
        deadline = time.monotonic() + 60
        while "queue folder" not in log.read_text():
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()[-2000:]
            time.sleep(0.2)
        assert queue.is_dir(), log.read_text()
        assert f"queue folder {queue}" in log.read_text()
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=90) == 0, log.read_text()[-2000:]
