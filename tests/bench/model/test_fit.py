"""`capbench validate --fit`'s optimiser: scipy's bounded least squares over the factors' scales, in log space."""

import json

import pytest

from bench.model import corpus, fit


def cases() -> list:
    goal = [c for c in corpus.load() if fit.in_goal(c) is None and c.gpu == "b200"]
    return goal[:4]


def test_the_fit_brings_a_scale_pushed_off_its_fit_back_and_lowers_the_loss():
    """kernel_scale started at 2.5x (every table latency 2.5x too slow): the fit moves it down and the loss falls;
    the factors it does not fit keep the base's scales."""
    replayer = fit.Replayer(workers=1)
    base = {"kernel_scale": 2.5, "launch_us": 3.0}
    before = fit.loss(replayer(cases(), base))
    scale, after = fit.fit(cases(), replayer, rounds=6, factors=("kernel_scale",), base=base)
    assert scale["kernel_scale"] < 2.0
    assert after < before
    assert scale["launch_us"] == 3.0


def test_scale_ranges_stop_where_every_gpu_is_clipped():
    """A scale past every GPU's bound is a flat loss: the fit's bounds end where the first GPU's value still moves."""
    lo, hi = fit.scale_range("launch_us")
    assert lo < 1 < hi
    for gpu in ("h200", "b200", "mi300x"):
        assert fit.scaled(gpu, {"launch_us": hi * 2}).launch_us == fit.scaled(gpu, {"launch_us": hi}).launch_us




def test_a_gpu_without_tables_has_its_own_roofline_scale_fitted_on_its_own_cases():
    """roofline_scale is fitted per GPU that no kernel table covers, on that GPU's cases: a fold with no MI300X case
    fits none for it (it keeps 1, no evidence), a scale named for MI300X moves no other GPU, and fitted on three
    cookbook MI300X runs it slows MI300X's roofline (the model is too fast there) and lowers their loss."""
    goal = [c for c in corpus.load() if fit.in_goal(c) is None and c.kind == "throughput"]
    mi300x = [c for c in goal if c.gpu == "mi300x" and c.source.org == "sgl-project"][:3]
    assert fit.per_gpu(cases()) == ()  # B200 has kernel tables
    assert fit.per_gpu(cases() + mi300x) == ("roofline_scale@mi300x",)
    assert fit.per_gpu(goal) == ("roofline_scale@a100-80gb", "roofline_scale@mi300x")
    assert fit.scaled("mi300x", {"roofline_scale@mi300x": 1.5, "kernel_us": 2.0}).roofline_scale == 1.5
    assert fit.scaled("h200", {"roofline_scale@mi300x": 1.5}).roofline_scale == 1.0
    assert fit.scale_range("roofline_scale@mi300x") == fit.PER_GPU_RANGE
    replayer = fit.Replayer(workers=1)
    before = fit.loss(replayer(mi300x, {}))
    scale, after = fit.fit(mi300x, replayer, rounds=5, factors=("roofline_scale@mi300x",))
    assert scale["roofline_scale@mi300x"] > 1.1 and after < before


def test_corpus_json_holds_each_gpus_own_factor(tmp_path, monkeypatch):
    """write() stores per GPU the value its scales give, under the factor's own name (as load_efficiency reads it):
    MI300X's roofline_scale, the other GPUs' at 1; the shared kernel_us on every GPU."""
    monkeypatch.setattr(fit, "write_validation", lambda *a: None)
    replays = fit.Replayer(workers=1)(cases()[:1], {})
    fit.write({"kernel_us": 2.0, "roofline_scale@mi300x": 1.7}, replays, [], {}, [], tmp_path / "corpus.json")
    written = json.loads((tmp_path / "corpus.json").read_text())
    assert written["gpus"]["mi300x"]["roofline_scale"] == 1.7 and written["gpus"]["b200"]["roofline_scale"] == 1.0
    assert written["default"]["roofline_scale"] == 1.0 and written["scale"]["roofline_scale@mi300x"] == 1.7
    assert written["gpus"]["mi300x"]["kernel_us"] == pytest.approx(2.0 * fit.priors("mi300x").kernel_us)
    assert set(written["gpus"]["mi300x"]) == {"kernel_us", "roofline_scale"}
    assert calibration_of(tmp_path / "corpus.json", "mi300x").roofline_scale == 1.7


def calibration_of(path, gpu: str):
    from bench.model.step.calibration import load_efficiency

    return load_efficiency(gpu, path, fitted=False)
