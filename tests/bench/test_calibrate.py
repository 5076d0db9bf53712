"""Calibration: fitting the performance model's efficiencies to measured runs."""

import json
import subprocess
import sys

import pytest

from bench import calibrate as cal
from bench.errors import BadInput
from bench.model import Deployment, Efficiency, catalog
from bench.store import Store

HIDDEN = {"hbm_eff": 0.45, "bf16_eff": 0.35, "kernel_us": 8.0, "step_overhead_ms": 4.0, "kernel_scale": 1.6}


def synthetic_run(dep: Deployment, users: int, prompt: int, output: int, n: int, hidden: Efficiency):
    """Requests arriving as a steady stream, 'measured' by replaying them with the hidden factors."""
    gap = 0.5 / users
    run = cal.MeasuredRun(f"u{users}", dep, 1.0, [i * gap for i in range(n)], [prompt] * n, [output] * n,
                          list(range(n // 5, n)), {})
    run.measured = cal.predict(run, hidden)
    return run


def test_fit_recovers_what_hidden_factors_predict_when_the_model_is_right():
    """Runs 'measured' with hidden factors: the fit reproduces them, and predicts a run it was not fitted on (the
    factors themselves trade off, e.g. bandwidth against per-step overhead at small batch: judge predictions)."""
    dep = Deployment(catalog.model("glm-4.6"), catalog.gpu("h200"), 8)
    hidden = Efficiency(**HIDDEN)
    runs = [synthetic_run(dep, 1, 200, 64, 40, hidden), synthetic_run(dep, 64, 3000, 128, 300, hidden),
            synthetic_run(dep, 16, 8000, 16, 60, hidden)]
    held_out = synthetic_run(dep, 96, 24000, 256, 200, hidden)  # long contexts: another regime
    start = Efficiency()
    before, result = cal.errors(runs, start), cal.fit_with_uncertainty(runs, start)
    fitted = result.eff
    after = cal.errors(runs, fitted)
    assert max(after.values()) < 0.05 < max(before.values())
    assert max(cal.errors([held_out], fitted).values()) < 0.10 < max(cal.errors([held_out], start).values())
    # H200 has kernel tables: the fit moves their scale, and says how well the runs pin each factor
    assert result.factors == cal.KERNEL and fitted.kernel_scale == pytest.approx(1.6, rel=0.15)
    assert 0 <= result.uncertainty["kernel_scale"] < 0.2


def test_a_gpu_without_kernel_tables_fits_the_roofline():
    dep = Deployment(catalog.model("glm-4.6"), catalog.gpu("mi300x"), 8)
    hidden = Efficiency(**HIDDEN)
    runs = [synthetic_run(dep, 1, 200, 64, 30, hidden), synthetic_run(dep, 32, 3000, 128, 120, hidden)]
    result = cal.fit_with_uncertainty(runs, Efficiency())
    assert result.factors == cal.ROOFLINE
    assert max(cal.errors(runs, result.eff).values()) < 0.05


def capbench(*args: str, timeout: float = 180) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", "from bench.cli import main; main()", *args],
                          capture_output=True, text=True, timeout=timeout)


@pytest.mark.timing  # fits efficiencies to a twin's wall-clock latencies: beside other tests it fitted the host (CI)
def test_calibrate_a_twin_with_hidden_efficiencies(tmp_path):
    hidden = tmp_path / "hidden.json"
    hidden.write_text(json.dumps(HIDDEN))
    workload = tmp_path / "w.yaml"
    workload.write_text("type: synthetic\ninput: {dist: uniform, min: 500, max: 3000}\n"
                        "output: {dist: uniform, min: 16, max: 48}\n")
    db = tmp_path / "c.duckdb"
    # twice as fast as the GPUs for 5 s: the same modelled 10 s a run (fitted hbm_eff 0.35 vs 0.51 at time_scale=1
    # for 10 s, prior 0.95, hidden 0.45: both well within the check below)
    spec = f"twin:glm-4.6@h200x8,time_scale=2,calibration={hidden}"
    for users in (1, 12):
        out = capbench("run", "--target", spec, "--profile", "users", "--users", str(users), "--duration", "5",
                       "--workload", str(workload), "--db", str(db), "--no-live")
        assert out.returncode == 0, out.stderr[-2000:]
    store = Store(db)
    ids = list(store.runs().run_id)
    start, fitted, before, after = cal.calibrate(store, ids, None, tmp_path / "fitted.json")
    # the twin adds its own CPU overhead on this machine, so recovery is approximate: the fit must move the
    # kernel tables' scale from the prior (1.0) towards the hidden 1.6 and cut the error
    assert sum(after.values()) < sum(before.values())
    eff = fitted.eff
    assert abs(eff.kernel_scale - HIDDEN["kernel_scale"]) < abs(start.kernel_scale - HIDDEN["kernel_scale"])
    written = json.loads((tmp_path / "fitted.json").read_text())
    assert written["gpus"]["h200"]["kernel_scale"] == pytest.approx(eff.kernel_scale, rel=1e-5)
    assert written["runs"]["h200"] == ids and "kernel_scale" in written["uncertainty"]["h200"]
    # the twin reads it back
    again = capbench("calibrate", "--runs", ",".join(ids), "--db", str(db), "--out", str(tmp_path / "f2.json"))
    assert again.returncode == 0, again.stderr
    assert "prediction error" in again.stdout and "kernel_scale" in again.stdout and "standard error" in again.stdout


def test_bad_runs_are_one_line(tmp_path):
    db = tmp_path / "c.duckdb"
    store = Store(db)
    run_id = store.start_run(label="real", target="http://127.0.0.1:1", profile="poisson", config={})
    store.finish_run(run_id, "completed")
    out = capbench("calibrate", "--runs", "nope", "--db", str(db))
    assert out.returncode == 2 and "unknown run" in out.stderr and "Traceback" not in out.stderr
    with pytest.raises(BadInput, match="needs --deployment"):
        cal.load_run(store, run_id)
