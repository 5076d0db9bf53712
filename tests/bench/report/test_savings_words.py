"""The savings on the first screen are a decomposition (BF16 KV and the shipped experts -> the asked KV dtype ->
the recommended experts): each later step says it is counted from the one before, so two equal figures read as two
steps that add up, never as one saving counted twice."""

from bench.model.answer import Saving
from bench.report.wording import saving_words


def test_a_later_step_says_it_comes_on_top_of_the_one_before():
    kv = Saving("FP8 KV cache", "b200 bf16 KV", "b200 fp8 KV", 34_982.0, 2.0, 1.24)
    experts = Saving("NVFP4 experts", "b200 fp8 KV", "b200 fp8 KV nvfp4", 34_982.0, 1.0, 2.02)
    first, then = saving_words(kv), saving_words(experts, then=True)
    assert first == "FP8 KV cache: saves $34,982 a month (2.00x KV tokens, 1.24x req/s an instance)"
    assert then == "Then NVFP4 experts: saves $34,982 a month more (1.00x KV tokens, 2.02x req/s an instance)"
    costs = Saving("INT4 experts", "a", "b", -500.0, 1.1, 0.9)
    assert saving_words(costs, then=True).startswith("Then INT4 experts: costs $500 a month more")
    none = Saving("INT4 experts", "a", "b", 0.0, 1.5, 1.0)
    assert saving_words(none) == ("INT4 experts: no saving at this load (1.50x KV tokens, 1.00x req/s an instance): "
                                  "headroom")
