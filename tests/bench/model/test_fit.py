"""`capbench validate --fit`'s optimiser: scipy's bounded least squares over the factors' scales, in log space."""

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
