"""`capbench serve`'s runner takes regular files only from its queue folder (bench/files.py): a FIFO named x.yaml
(which blocked the runner forever), a link to /dev/zero (read until memory ran out) and a file of a campaign that
cannot fit are moved to rejected/ with a one-line reason, and the runner goes on."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from tests.bench.cli.test_serve_queue_folder import _free_port

CAPBENCH = str(Path(sys.executable).parent / "capbench")
UNFIT = """name: unfit
slo: "ttft=4s,tpot=100ms"
deployments:
  - {name: pd, twin: "kimi-k2-thinking@h200x8,dp=8,kv=fp8_e4m3,prefill_tp=3"}
loads:
  - {name: x, workload: campaign-prefill-heavy, sweep: {start: 0.5}}
"""


def test_the_runner_rejects_what_is_not_a_regular_campaign_file(tmp_path):
    queue = tmp_path / "campaign-queue"
    queue.mkdir()
    os.mkfifo(queue / "1-fifo.yaml")
    (queue / "2-zero.yaml").symlink_to("/dev/zero")
    (queue / "3-unfit.yaml").write_text(UNFIT)
    log = tmp_path / "serve.log"
    with log.open("w") as out:
        proc = subprocess.Popen([CAPBENCH, "serve", "--db", str(tmp_path / "c.duckdb"), "--port", str(_free_port())],
                                stdout=out, stderr=subprocess.STDOUT, cwd=tmp_path)
    rejected = queue / "rejected"
    try:
        deadline = time.monotonic() + 120
        while len(list(rejected.glob("*.reason.txt"))) < 3:
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()[-2000:]
            time.sleep(0.3)
        reasons = {p.name.split("-")[1].split(".")[0]: p.read_text() for p in rejected.glob("*.reason.txt")}
        assert "not a regular file (a FIFO)" in reasons["fifo"]
        assert "not a regular file (a character device)" in reasons["zero"]
        assert "does not fit 3x h200" in reasons["unfit"]
        assert all("Traceback" not in r for r in reasons.values())
        assert not list(queue.glob("*.yaml"))
        assert proc.poll() is None  # the runner goes on
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=90) == 0, log.read_text()[-2000:]
