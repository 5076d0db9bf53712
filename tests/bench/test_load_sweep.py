"""`capbench run --profile sweep` searches with bench/sweep.py (the campaigns' sweep): up the profile's ladder while
no stage saturates, then bisection to the profile's resolution, on a server that keeps up with at most 10 req/s
(stages stand in for Locust runs: the runner's own stages are tested in test_runner.py against a stub server)."""

import math
from types import SimpleNamespace

import pytest

from bench import load_sweep
from bench.store import Store
from loadgen import profiles

LIMIT = 10.0  # requests/s the server finishes; a stage saturates when it finishes under 0.9 x offered


@pytest.fixture
def fake_stages(monkeypatch):
    offered: list[float | None] = []

    def run_one(store, opts, prof, wl, model, extra=None, warmup_s=None):
        rate = extra["offered_rps"]
        offered.append(rate)
        summary = {"profile": prof.name, "throughput_rps": 2.0, "e2e_p50": 0.5, "success_rate": 1.0,
                   "slo_attainment": 1.0, **({"e2e_p50": 0.6} if rate else {})}
        return SimpleNamespace(run_id=f"run-{len(offered)}", status="completed", summary=summary)

    def finished_within(con, run_id, seconds):
        rate = offered[int(run_id.split("-")[1]) - 1]
        return min(rate, LIMIT) * 2.0  # per 2 s stage

    monkeypatch.setattr(load_sweep.queries, "finished_within", finished_within)
    return run_one, offered


def test_the_run_sweep_climbs_the_ladder_then_bisects_to_five_percent(fake_stages, tmp_path, capsys):
    run_one, offered = fake_stages
    prof = profiles.Profile("sweep", "sweep", {"stage_duration": 2, "factors": [1.5, 2, 3, 4, 6, 8], "refine": 6})
    results = load_sweep.run_sweep(Store(tmp_path / "s.duckdb"), None, prof,
                                   None, "m", run_one)
    assert offered[:7] == [None, 3.0, 4.0, 6.0, 8.0, 12.0, math.sqrt(8.0 * 12.0)]  # 1 user, ladder, then bisection
    held = [r for r in offered[1:] if min(r, LIMIT) >= 0.9 * r]
    missed = [r for r in offered[1:] if min(r, LIMIT) < 0.9 * r]
    assert max(held) / min(missed) > 1 / 1.05 and min(missed) > LIMIT / 0.9 > max(held)  # the bracket: within 5 %
    assert len(results) == len(offered)
    out = capsys.readouterr().out
    assert "bracket" in out and "SLO broke at 12" in out


def test_a_ladder_whose_first_rate_saturates_stops_there(fake_stages, tmp_path):
    run_one, offered = fake_stages
    prof = profiles.Profile("sweep", "sweep", {"stage_duration": 2, "factors": [400]})
    load_sweep.run_sweep(Store(tmp_path / "s.duckdb"), None, prof, None, "m",
                         run_one)
    assert offered == [None, 800.0]  # nothing below the ladder was asked for: no search downward, no bisection
