"""Intervals: a figure from repeats is their mean with a 90 % t interval; a gain's interval is that of the log
ratio; a gain whose interval contains 1.0x is "not distinguishable" in words; one run has no interval and says so."""

import math

from bench.model.evidence.confidence import gain_interval, gain_words, mean_interval


def test_mean_interval_of_repeats():
    i = mean_interval([1.0, 1.2, 1.1])
    # mean 1.1, sd 0.1, t(2) = 2.920: 1.1 +- 2.920 * 0.1 / sqrt 3
    assert math.isclose(i.value, 1.1) and math.isclose(i.high - i.value, 2.920 * 0.1 / math.sqrt(3), rel_tol=1e-9)
    assert "90 %" in i.method and i.half_width < 0.16
    one = mean_interval([2.0])
    assert one.low is None and "no interval" in one.text()


def test_a_gain_is_distinguishable_only_when_its_interval_excludes_one():
    clear = gain_interval([2.0, 2.05, 1.95], [1.0, 1.02, 0.98])
    assert 1.9 < clear.value < 2.1 and clear.low > 1.0 and gain_words(clear) == "a gain"
    blurred = gain_interval([1.05, 0.9, 1.2], [1.0, 1.1, 0.95])
    assert blurred.low < 1.0 < blurred.high and gain_words(blurred) == "not distinguishable from no gain"
    assert gain_words(gain_interval([1.5], [1.0])).startswith("one run each")
    assert gain_interval([0.0, 1.0], [1.0, 1.0]) is None
