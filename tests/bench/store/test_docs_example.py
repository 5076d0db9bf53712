"""docs/results-store.md's Python example, run as it stands in a scratch folder (a page's example must work)."""

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


def test_the_results_store_example_runs(tmp_path):
    page = (ROOT / "docs/results-store.md").read_text()
    [code] = re.findall(r"```python\n(.*?)```", page, re.S)
    (tmp_path / "data").mkdir()
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=120,
                         env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert out.returncode == 0, out.stderr
    measured, ttft_p50 = out.stdout.split()
    assert measured == "1" and abs(float(ttft_p50) - 0.2) < 0.002
