"""A configuration as a curve over concurrency: throughput per GPU against tokens/s per user, its 80 % band, the
published points of the same configuration, and the Pareto front over all curves."""

from bench.model import Deployment, catalog, corpus, load_workload
from bench.model.advice.curve import CurvePoint, curve, front, published

GLM = Deployment(catalog.model("glm-4.6"), catalog.gpu("b200"), 8)


def test_more_concurrency_buys_throughput_per_gpu_with_speed_per_user():
    pts = curve("glm b200", GLM, load_workload("chat"), levels=(1, 4, 16, 64))
    assert [p.concurrency for p in pts] == [1, 4, 16, 64]
    gpu, user = [p.tps_per_gpu for p in pts], [p.tps_per_user for p in pts]
    assert gpu == sorted(gpu) and gpu[-1] > 8 * gpu[0]
    assert user == sorted(user, reverse=True)
    for p in pts:
        assert p.tps_per_gpu_low < p.tps_per_gpu < p.tps_per_gpu_high
        assert p.tps_per_user_low < p.tps_per_user < p.tps_per_user_high


def test_the_curve_stops_at_the_instance_s_max_running_requests():
    from bench.model.fits.capacity import capacity

    limit = capacity(GLM, with_ratios=False).max_running_requests
    pts = curve("glm b200", GLM, load_workload("chat"), levels=(1, limit + 1))
    assert [p.concurrency for p in pts] == [1]


def test_the_front_keeps_only_points_nobody_beats_on_both_axes():
    def pt(g, u):
        return CurvePoint("x", 1, g, u, g, g, u, u, 0.1)

    marked = front([pt(100, 10), pt(50, 50), pt(40, 40), pt(10, 100)])
    assert [p.pareto for p in marked] == [True, True, False, True]


def test_published_points_of_the_same_configuration_are_overlaid():
    pub = published(corpus.load(), GLM)
    # the cookbook's 9 runs of GLM-4.6 on 8x B200 TP8 with BF16 KV, and Ben Hamm's one-request run of the same
    assert len(pub) == 10 and {p["case"].split("/")[0] for p in pub} == {"sglang-cookbook-glm-4.6",
                                                                           "benhamm-sglang-b200-sweep"}
    assert {p["concurrency"] for p in pub} >= {1, 16, 64}
    other = Deployment(catalog.model("glm-4.6"), catalog.gpu("b200"), 8, kv_dtype="fp8_e4m3")
    assert published(corpus.load(), other) == []  # another KV dtype is another configuration
