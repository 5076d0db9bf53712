"""The Planner page's colocated vs disaggregated section: the same rows as `capbench plan` prints (one function,
bench/report/pd.py), and it says where the disaggregated figures come from and how thin that evidence is."""

from __future__ import annotations

from streamlit.testing.v1 import AppTest

from bench.model import Question, capacity, catalog, make_plan
from bench.model.pd import versus as pd_versus
from bench.report import pd as pd_report
from tests.dashboard.apptest import ROOT, no_exception


def test_the_planner_shows_pd_beside_colocated_with_the_clis_figures():
    at = AppTest.from_file(str(ROOT / "dashboard" / "views" / "planner.py"), default_timeout=900).run()
    no_exception(at)
    dep = capacity.Deployment(catalog.model("kimi-k2-thinking"), catalog.gpu("h200"), 8, kv_dtype="fp8_e4m3")
    q = Question(model="kimi-k2-thinking", gpu="h200", tp=8, gpus=8, kv_dtype="fp8_e4m3", context=dep.context_len,
                 workload="chat", price_per_gpu_hour=3.79, search_gpus=("h200",))
    expected = pd_report.versus_rows(pd_versus.compare(make_plan(q)))
    shown = [t.value for t in at.table if "disaggregated" in list(t.value.index)]
    assert len(shown) == 1
    table = shown[0]
    for row in expected:
        got = table.loc[row[""]]
        assert got["GPUs"] == row["GPUs"] and got["$ / month"] == row["$ / month"]
        assert got["deployment"] == row["deployment"]
    text = " ".join(m.value for m in at.markdown)
    assert "little evidence" in text and "assumptions" in text
    assert any("--disaggregation-mode prefill" in c.value for c in at.code)
