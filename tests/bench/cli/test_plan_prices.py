"""`--price` as a user gives it to the installed `capbench plan` (from a tmp folder): one figure is --gpu's and the
answer says every other searched GPU stays at the catalog's price; one figure per GPU prices each GPU named, the
disaggregated search included; a price that would go unused, or is not a price, is one line and exit 2."""

import json
import subprocess
from pathlib import Path

from bench.model import catalog

EXE = Path(__file__).resolve().parents[3] / ".venv" / "bin" / "capbench"
ASK = ("plan", "--model", "kimi-k2-thinking", "--workload", "chat", "--rate", "20", "--gpus", "h200,b200")


def capbench(tmp_path: Path, *args: str, timeout: float = 900) -> subprocess.CompletedProcess:
    return subprocess.run([str(EXE), *args], cwd=tmp_path, capture_output=True, text=True, timeout=timeout)


def unwrapped(text: str) -> list[str]:
    """The first screen's sentences: a line indented by two spaces continues the one above (wrapped to the width)."""
    lines: list[str] = []
    for line in text.splitlines():
        if line.startswith("  ") and lines:
            lines[-1] += " " + line.strip()
        else:
            lines.append(line)
    return lines


def test_one_price_is_the_gpus_and_the_answer_says_the_others_are_the_catalogs(tmp_path):
    out = capbench(tmp_path, *ASK, "--price", "3.10", "--no-pd")
    assert out.returncode == 0, out.stderr
    b200 = catalog.gpu("b200").price_per_gpu_hour
    said = f"$ per GPU-hour: H200 $3.10 (given); the catalog's indicative prices (not given) for B200 ${b200:.2f}"
    lines = unwrapped(out.stdout)
    assert said in lines  # on the first screen, before the pointer to the tables
    assert lines.index(said) < next(i for i, x in enumerate(lines) if x.startswith("More:"))


def test_a_price_per_gpu_prices_every_gpu_it_names(tmp_path):
    out = capbench(tmp_path, *ASK, "--price", "h200=3.10,b200=4.00", "--json", "--max-nodes", "1")
    assert out.returncode == 0, out.stderr
    plan = json.loads(out.stdout)
    assert plan["question"]["prices"] == {"h200": {"usd_per_gpu_hour": 3.1, "given": True},
                                          "b200": {"usd_per_gpu_hour": 4.0, "given": True}}
    prices = {(r["gpu"], r["price_per_gpu_hour"]) for r in plan["configurations"]}
    assert prices == {("h200", 3.1), ("b200", 4.0)}
    d = (plan.get("disaggregated") or {}).get("disaggregated")
    if d is not None:  # the split answer is costed at the same prices
        assert d["price_per_gpu_hour"] == {"h200": 3.1, "b200": 4.0}[d["gpu"]]


def test_a_price_that_would_go_unused_or_is_no_price_is_one_line_and_exit_2(tmp_path):
    for price, said in (("mi300x=2.5", "a price was given for mi300x, which is neither --gpu nor among --gpus"),
                        ("b200=cheap", "--price b200: 'cheap' is not a $ per GPU-hour"),
                        ("-1", "--price must be > 0"), ("b200=nan", "--price b200 must be a number, not nan"),
                        ("h200=3,h200=4", "--price names h200 twice"),
                        ("tpu=3", "tpu")):
        out = capbench(tmp_path, *ASK, "--price", price, "--no-pd", timeout=120)
        assert out.returncode == 2, (price, out.stdout, out.stderr)
        assert said in out.stderr and "Traceback" not in out.stderr and len(out.stderr.strip().splitlines()) == 1
