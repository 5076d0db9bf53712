"""bench.report's names load on first use: a command that prints tables does not import Altair and the charts
(~0.3 s of every `capbench capacity`, `plan`, `simulate`), and every name in __all__ still resolves."""

import subprocess
import sys

CODE = """
import sys
import bench.report
from bench.report import screen, terminal, wording  # what capbench plan prints with
assert "altair" not in sys.modules and "bench.report.charts" not in sys.modules, sorted(sys.modules)
for name in bench.report.__all__:
    getattr(bench.report, name)
from bench.report import CAMPAIGN_MORE, build
from bench.report.campaign_screen import MORE
from bench.report.content import build as built
assert CAMPAIGN_MORE is MORE and build is built
assert "altair" in sys.modules
try:
    bench.report.nothing_here
except AttributeError as e:
    print(e)
"""


def test_report_names_load_on_first_use():
    p = subprocess.run([sys.executable, "-c", CODE], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr[-3000:]
    assert "has no attribute 'nothing_here'" in p.stdout
