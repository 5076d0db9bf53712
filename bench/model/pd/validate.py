"""`capbench validate`'s disaggregated cases: published prefill/decode-disaggregated, wide-EP runs (LMSYS's
DeepSeek on 96 H100, the Mooncake team's Kimi K2 on 128 H200) replayed through disagg.py's step times, the way
their posts measured them: a prefill phase at a fixed number of prompt tokens per device, or a decode phase at a
fixed batch per device and KV length, each with the other phase given unlimited resources. The figure compared is
the one published (input or output tokens/s, for the instance or per node). error = predicted / published - 1.
"""

from __future__ import annotations

from bench.errors import BadInput
from bench.model.evidence.corpus import Case
from bench.model.evidence.validate import Replay
from bench.model.pd import disagg


def shape(case: Case) -> disagg.Shape:
    pd = case.pd
    return disagg.Shape(case.model, case.gpu, case.tp, case.tp, case.kv_dtype, case.weights,
                        eplb=bool(pd.get("redundant_experts")), prefill_dp_attention=case.dp_attention)


def replay(case: Case) -> Replay:
    r = Replay(case)
    pd, published = case.pd, case.pd.get("published", {})
    try:
        s = shape(case)
        if pd.get("phase") == "prefill":
            prompt = float(pd["prompt_len"])
            tokens = int(pd.get("tokens_per_device") or disagg.chunk(s))
            ln = disagg.Lengths(prompt, 0.0, 1.0, int(prompt) + 1)
            step = disagg.prefill_step_s(s, tokens, ln)
            total = tokens * s.dp("prefill") / step
            r.predicted = {"input_tok_s": total, "input_tok_s_per_node": total / case.nodes}
        elif pd.get("phase") == "decode":
            batch = int(pd["batch_per_device"])
            pool = disagg.decode_pool(s)
            if batch * float(pd["kv_len"]) > pool.tokens_per_rank:
                r.why_not = (f"{batch} requests of {pd['kv_len']} tokens exceed a rank's KV pool of "
                             f"{pool.tokens_per_rank:,} tokens in the capacity model")
                return r
            step = disagg.decode_step_s(s, batch, float(pd["kv_len"]))
            total = batch * s.dp("decode") / step
            r.predicted = {"output_tok_s": total, "output_tok_s_per_node": total / case.nodes, "tpot_ms": step * 1e3}
        else:
            r.why_not = f"unknown phase {pd.get('phase')!r}"
            return r
    except (BadInput, KeyError, TypeError, ValueError) as e:
        r.why_not = f"cannot replay: {e}"
        return r
    for figure in ("input_tok_s", "output_tok_s", "input_tok_s_per_node", "output_tok_s_per_node"):
        if published.get(figure) and figure in r.predicted:
            r.errors[figure] = r.predicted[figure] / float(published[figure]) - 1
            break  # the whole-deployment figure where published, else the per-node one
    return r


def replay_all(cases: list[Case]) -> list[Replay]:
    return [replay(c) for c in cases if c.kind == "disaggregated"]
