"""`capbench serve --templates` in a real browser: a campaign pasted on the Campaigns page that names the operator's
`ssh gpu1 {command}` template (a stand-in ssh that, like OpenSSH, hands its words to `sh -c`) and carries
`$(touch MARKER)` in its model path, scales path and flags is refused on the page, field by field; nothing reaches
the queue and no marker file is made."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
from playwright.sync_api import sync_playwright

from tests.e2e.test_browser import ARGS, CHROMIUM, _free_port

ROOT = Path(__file__).resolve().parents[2]
HOSTILE = """name: pwn
deployments:
  - {{name: s, sglang: {{model: glm-4.6, template: ssh, model_path: "x$(touch {m})", kv_scales: "y`touch {m}`",
      flags: [--served-model-name, "z;touch {m}"]}}}}
loads:
  - {{name: a, workload: chat, profile: poisson, rate: 1}}
"""


def test_a_pasted_campaign_with_shell_in_its_values_is_refused_on_the_page(tmp_path):
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    (bin_ / "ssh").write_text('#!/bin/sh\nshift\nexec sh -c "$*"\n')
    (bin_ / "ssh").chmod(0o755)
    ops = tmp_path / "templates.yaml"
    ops.write_text("ssh: {start: 'ssh gpu1 {command}', host: 127.0.0.1}\n")
    port = _free_port()
    log = open(tmp_path / "serve.log", "w")
    env = {**os.environ, "PATH": f"{bin_}{os.pathsep}{os.environ['PATH']}"}
    proc = subprocess.Popen([str(Path(sys.executable).parent / "capbench"), "serve", "--db",
                             str(tmp_path / "c.duckdb"), "--port", str(port), "--templates", str(ops)], cwd=ROOT,
                            stdout=log, stderr=subprocess.STDOUT, env=env)
    url = f"http://127.0.0.1:{port}"
    marker = tmp_path / "PWNED"
    try:
        deadline = time.monotonic() + 90
        while True:
            try:
                if httpx.get(f"{url}/_stcore/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert proc.poll() is None and time.monotonic() < deadline, (tmp_path / "serve.log").read_text()
            time.sleep(0.3)
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
            page = browser.new_page(viewport={"width": 1400, "height": 1400})
            page.goto(f"{url}/campaigns", timeout=60_000)
            page.get_by_test_id("stExpander").get_by_text("Queue a campaign").click(timeout=120_000)
            box = page.get_by_label("or paste it here")
            box.fill(HOSTILE.format(m=marker))
            box.press("Control+Enter")
            page.get_by_role("button", name="Queue it").click()
            page.get_by_text("deployments[0].sglang.model_path:", exact=False).wait_for(timeout=30_000)
            text = page.inner_text("body")
            for field in ("sglang.model_path:", "sglang.kv_scales:", "sglang.flags:"):
                assert field in text, field
            assert "a shell would read" in text
            browser.close()
        assert not list((tmp_path / "campaign-queue").glob("*.yaml"))  # nothing reached the queue
        assert proc.poll() is None
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=90)
    assert not marker.exists()
