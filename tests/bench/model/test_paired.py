"""A/B on the same problems: the difference, its 90 % interval's coverage, McNemar's p against scipy, the gate."""

import numpy as np
import pytest
from scipy import stats

from bench.model import drop_gate, paired_difference


def _pairs(n: int, a_only: int, b_only: int, both: int) -> tuple[list[bool], list[bool]]:
    a = [True] * a_only + [False] * b_only + [True] * both + [False] * (n - a_only - b_only - both)
    b = [False] * a_only + [True] * b_only + [True] * both + [False] * (n - a_only - b_only - both)
    return a, b


def test_counts_difference_and_mcnemar_exact_p():
    p = paired_difference(*_pairs(100, a_only=7, b_only=2, both=70))
    assert (p.n, p.a_passed, p.b_passed, p.a_only, p.b_only) == (100, 77, 72, 7, 2)
    assert p.diff == pytest.approx(-5.0) and p.low < -5.0 < p.high
    assert p.p_value == pytest.approx(stats.binomtest(2, 9, 0.5).pvalue)
    assert p.said().startswith("-5.0 points [")


def test_no_disagreement_is_not_certainty_at_a_few_problems():
    small = paired_difference(*_pairs(10, 0, 0, 8))
    assert small.diff == 0 and small.low < -10 and small.high > 10  # wide, not [0, 0]
    large = paired_difference(*_pairs(1000, 0, 0, 800))
    assert -0.5 < large.low < 0 < large.high < 0.5


def test_the_interval_covers_the_true_difference_about_90_percent_of_the_time():
    rng = np.random.default_rng(7)
    n, a_rate, lose, gain = 300, 0.7, 0.06, 0.03  # B loses 6 % of A's passes, gains 3 % of its failures
    truth = 100 * (a_rate * (1 - lose) + (1 - a_rate) * gain - a_rate)
    hits = 0
    for _ in range(1000):
        a = rng.random(n) < a_rate
        b = np.where(a, rng.random(n) >= lose, rng.random(n) < gain)
        p = paired_difference(list(a), list(b))
        hits += p.low <= truth <= p.high
    assert 0.86 <= hits / 1000 <= 0.95


def test_gate_passes_fails_or_says_how_many_more_problems_would_decide():
    ok = drop_gate(paired_difference(*_pairs(2000, 10, 10, 1500)), 2.0)
    assert ok.status == "passed" and "excludes a drop larger than 2 points" in ok.words
    bad = drop_gate(paired_difference(*_pairs(2000, 200, 10, 1300)), 2.0)
    assert bad.status == "failed" and "only drops larger than 2" in bad.words
    unsure = drop_gate(paired_difference(*_pairs(164, 8, 3, 120)), 2.0)
    assert unsure.status == "inconclusive" and unsure.more_problems > 0
    assert f"about {unsure.more_problems:,} more problems" in unsure.words


def test_the_more_problems_estimate_decides_at_the_same_spread():
    a, b = _pairs(164, 9, 2, 120)  # about -4.3 points: a drop, not yet sure past 2
    first = drop_gate(paired_difference(a, b), 2.0)
    assert first.status == "inconclusive"
    scale = (164 + first.more_problems) / 164 * 1.1  # the same shares, 10 % more problems than said
    n = int(164 * scale)
    later = drop_gate(paired_difference(*_pairs(n, round(9 * scale), round(2 * scale), round(120 * scale))), 2.0)
    assert later.status == "failed"


def test_different_lengths_are_refused():
    with pytest.raises(ValueError):
        paired_difference([True], [True, False])
