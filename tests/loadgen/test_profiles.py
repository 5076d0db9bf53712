"""Profiles: seeded open-loop schedules with the asked-for rate shape; closed-loop and pool shapes."""

import numpy as np
import pytest

from loadgen import profiles
from loadgen.profiles import ProfileError


def cv(x: np.ndarray) -> float:
    gaps = np.diff(x)
    return float(gaps.std() / gaps.mean())


def test_every_built_in_profile_loads():
    for name in profiles.names():
        p = profiles.load(name)
        if p.open_loop:
            a = p.arrivals(1)
            assert len(a) > 10 and np.all(np.diff(a) >= 0) and a[0] >= 0 and a[-1] <= p.duration + 1e-9


def test_poisson_exact_count_and_exponential_gaps():
    p = profiles.load("poisson", {"rate": 50, "duration": 60})
    a = p.arrivals(seed=3)
    assert len(a) == 3000
    assert cv(a) == pytest.approx(1.0, abs=0.06)
    assert np.array_equal(a, p.arrivals(seed=3)) and not np.array_equal(a, p.arrivals(seed=4))


def test_nested_poisson_stages_of_one_seed_send_the_same_arrivals_compressed_whatever_the_warmup():
    slow = profiles.load("poisson", {"rate": 20, "duration": 10, "nested": True})
    fast = profiles.load("poisson", {"rate": 22, "duration": 10, "nested": True})
    a, b = slow.arrivals(seed=5, warmup_s=2.5), fast.arrivals(seed=5, warmup_s=2.5)
    ma, mb = a[a >= 2.5] - 2.5, b[b >= 2.5] - 2.5
    assert (len(ma), len(mb)) == (200, 220)  # the exact count, as a plain Poisson profile's
    assert len(a) - len(ma) == 50 and len(b) - len(mb) == 55
    assert (mb[:200] < ma).all()  # the faster stage's first 200 arrivals: the slower one's, each earlier
    assert np.corrcoef(ma, mb[:200])[0, 1] > 0.999
    assert cv(mb) == pytest.approx(1.0, abs=0.15)
    # the measured phase does not move with the warm-up's length; a plain profile's does
    assert np.allclose(ma, (lambda x: x[x >= 5.0] - 5.0)(slow.arrivals(seed=5, warmup_s=5.0)), rtol=0, atol=1e-9)
    plain = profiles.load("poisson", {"rate": 20, "duration": 10})
    c, d = plain.arrivals(seed=5, warmup_s=2.5), plain.arrivals(seed=5, warmup_s=5.0)
    assert not np.array_equal(c[c >= 2.5] - 2.5, d[d >= 5.0] - 5.0)
    with pytest.raises(ProfileError, match="nested must be true or false"):
        profiles.load("poisson", {"rate": 20, "duration": 10, "nested": 1})


def test_gamma_burstiness_and_constant_spacing():
    bursty = profiles.load("gamma", {"rate": 20, "duration": 100, "burstiness": 0.25}).arrivals(1)
    assert len(bursty) == 2000 and cv(bursty) == pytest.approx(2.0, rel=0.15)
    even = profiles.load("constant", {"rate": 10, "duration": 10}).arrivals(1)
    assert len(even) == 100 and np.allclose(np.diff(even), 0.1)


def test_time_varying_rates_follow_their_shape():
    ramp = profiles.load("ramp", {"start_rate": 0, "end_rate": 40, "duration": 20}).arrivals(1)
    assert len(ramp) == 400
    assert np.sum(ramp >= 10) == pytest.approx(300, rel=0.1)  # three quarters of the area is in the 2nd half
    spike = profiles.load("spike", {"rate": 5, "spike_rate": 100, "spike_at": 10, "spike_duration": 2,
                                    "duration": 20}).arrivals(1)
    assert np.sum((spike >= 10) & (spike < 12)) == pytest.approx(200, rel=0.15)
    steps = profiles.load("steps", {"rates": [10, 0, 30], "step_duration": 5}).arrivals(1)
    assert np.sum((steps > 5.2) & (steps < 9.8)) == 0 and len(steps) == pytest.approx(200, abs=2)
    day = profiles.load("diurnal", {"min_rate": 0, "max_rate": 20, "period": 20, "duration": 20}).arrivals(1)
    assert np.sum((day > 7.5) & (day < 12.5)) > 3 * np.sum(day < 5)


def test_warmup_comes_first_at_the_initial_rate():
    p = profiles.load("constant", {"rate": 10, "duration": 5})
    a = p.arrivals(1, warmup_s=2)
    assert len(a) == 70 and np.sum(a < 2) == 20


def test_trace_offsets_from_millisecond_timestamps(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_text('{"timestamp": 5000, "input_length": 10, "output_length": 2, "hash_ids": [1]}\n\n'
                    '{"timestamp": 1000, "input_length": 10, "output_length": 2, "hash_ids": [1]}\n')
    p = profiles.load("trace", {"path": str(path), "speedup": 2.0})
    assert list(p.arrivals()) == [0.0, 2.0]
    path.write_text("not json\n")
    with pytest.raises(ProfileError, match="t.jsonl:1"):
        profiles.load("trace", {"path": str(path)})


def test_user_yaml_and_bad_profiles(tmp_path):
    f = tmp_path / "mine.yaml"
    f.write_text("type: poisson\nrate: 3\nduration: 10\n")
    p = profiles.load(str(f), {"rate": 4})
    assert p.name == "mine" and len(p.arrivals()) == 40
    with pytest.raises(ProfileError, match="unknown profile"):
        profiles.load("nope")
    with pytest.raises(ProfileError, match="rate"):
        profiles.load("poisson", {"rate": -1})
    with pytest.raises(ProfileError, match="ramp .ramp. has no parameter rate; it takes arrival"):
        profiles.load("ramp", {"rate": 3})  # --rate given to a profile that does not read it
    f.write_text("type: ramp\nduration: 10\n")
    with pytest.raises(ProfileError, match="start_rate"):
        profiles.load(str(f))


def test_max_concurrency_is_an_open_loop_whole_number():
    assert profiles.load("poisson", {"max_concurrency": 8}).params["max_concurrency"] == 8
    for bad in (0, 2.5, True):
        with pytest.raises(ProfileError, match="max_concurrency must be"):
            profiles.load("poisson", {"max_concurrency": bad})
    with pytest.raises(ProfileError, match="users .users. has no parameter max_concurrency"):
        profiles.load("users", {"max_concurrency": 4})  # a closed loop holds its users in flight already


def test_the_sweep_bisects_as_told_and_refuses_nonsense():
    sweep = profiles.load("sweep")
    assert sweep.params["refine"] == 4 and sweep.params["resolution"] == 0.05  # the shipped file's, accepted
    for key, bad, said in (("refine", 2.5, "refine must be a whole number"), ("refine", 99, "refine must be"),
                           ("resolution", 0, "resolution must be a number > 0"), ("refine", "x", "refine must be")):
        with pytest.raises(ProfileError, match=said):
            profiles.load("sweep", {key: bad})


def test_sweep_rates_and_saturation():
    p = profiles.load("sweep")
    assert p.sweep_rates(2.0)[:3] == [3.0, 4.0, 6.0]
    assert profiles.load("sweep", {"rates": [1, 5]}).sweep_rates(2.0) == [1.0, 5.0]
    assert profiles.saturated(10, 9.5, 0.2, 0.1, 0.0, p.params) is None
    assert "achieved" in profiles.saturated(10, 7.0, 0.2, 0.1, 0.0, p.params)
    assert "median" in profiles.saturated(10, 10, 0.9, 0.1, 0.0, p.params)
    assert "error" in profiles.saturated(10, 10, 0.1, 0.1, 0.2, p.params)


def test_shapes():
    s = profiles.StagesShape([(2, 10.0), (5, 10.0)], 100)
    s.start_time -= 12
    assert s.tick() == (5, 100)
    s.start_time -= 10
    assert s.tick() is None
    s.extra_done = lambda after: after > 5
    assert s.tick() == (5, 100)
    done = {"v": False}
    pool = profiles.PoolShape(64, lambda t: done["v"])
    assert pool.tick() == (64, 64.0)
    done["v"] = True
    assert pool.tick() is None
