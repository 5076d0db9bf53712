"""Long generations and long contexts, where published FP8-KV damage shows.

`long`: the drift prompts (bench/drift_prompts.py, chat and code) answered greedily by both endpoints with top
logprobs and up to 16k tokens; drift's token agreement and top-k KL (bench/drift.py) reported by answer position:
the first 1k tokens, 1k-4k, 4k-16k. Agreement counts the positions both answers reached; the KL only positions before
the answer's first divergence (past it the two contexts differ, drift.py's rule); each answer's first divergence
falls in one bin: the table shows where answers part.
`retrieval`: a needle (an access code) at 10 %, 50 % or 90 % depth of a seeded haystack of about 32k, 64k and 120k
tokens (estimated at 1.5 tokens a word; 120k leaves room for the answer in a 128k window); passed when the answer
holds the code. Both families (Kimi K2, GLM-4.x) serve 128k, so the same problems serve both.
"""

from __future__ import annotations

import hashlib
import math
import random
import statistics
import time

from bench import drift, drift_prompts
from bench.eval.answer import Answer, cut
from bench.eval.client import Reply, chat

BINS = ((0, 1024, "first 1k"), (1024, 4096, "1k-4k"), (4096, 16384, "4k-16k"))
LONG_TOKENS = 16384
CONTEXTS = (32_000, 64_000, 120_000)
DEPTHS = (0.1, 0.5, 0.9)
TOKENS_PER_WORD = 1.5
SEED = 20261206


def long_prompts(limit: int | None, seed: int) -> list[dict]:
    from bench.eval import data

    items = [p for p in drift.load_prompts(None) if p["kind"] in ("chat", "code")]
    return data.pick(items, "id", limit, seed)


def retrieval_problems(limit: int | None, seed: int) -> list[dict]:
    from bench.eval import data

    rng = random.Random(SEED)
    out = []
    for tokens in CONTEXTS:
        for depth in DEPTHS:
            code = f"{rng.choice(drift_prompts.WORDS)}-{rng.randint(1000, 9999)}"
            city = rng.choice(["Oslo", "Lima", "Hanoi", "Accra", "Quito", "Perth"])
            needle = f"The access code for the {city} archive is {code}."
            text = haystack(rng, int(tokens / TOKENS_PER_WORD), needle, depth)
            out.append({"id": f"retrieval-{tokens // 1000}k-{int(depth * 100)}", "answer": code, "tokens": tokens,
                        "messages": [{"role": "user", "content": text + f"\n\nWhat is the access code for the {city} "
                                      "archive? Answer with the code only."}]})
    return data.pick(out, "id", limit, seed)


def haystack(rng: random.Random, words: int, needle: str, depth: float) -> str:
    sentences, n = [], 0
    while n < words:
        k = rng.randint(8, 16)
        sentences.append(" ".join(rng.choice(drift_prompts.WORDS) for _ in range(k)).capitalize() + ".")
        n += k
    sentences.insert(int(depth * len(sentences)), needle)
    return " ".join(sentences)


def retrieval_digest() -> str:
    """The retrieval problems are built, not shipped: their digest stands for a data file's checksum."""
    h = hashlib.sha256()
    for p in retrieval_problems(None, 0):
        h.update((p["id"] + p["answer"] + p["messages"][0]["content"]).encode())
    return h.hexdigest()


async def solve_retrieval(client, ep, problem: dict, seed: int, gate=None) -> Answer:
    began = time.monotonic()
    reply = await chat(client, ep, problem["messages"], 32, seed)
    latency = time.monotonic() - began
    if reply.error:
        return Answer("retrieval", problem["id"], "error", detail=reply.error, latency_s=latency)
    found = problem["answer"] in reply.content
    return Answer("retrieval", problem["id"], "passed" if found else "failed", text=cut(reply.content),
                  detail="" if found else f"expected {problem['answer']}", latency_s=latency,
                  completion_tokens=reply.completion_tokens)


async def ask_long(client, ep, prompt: dict, seed: int, ignore_eos: bool) -> Reply:
    return await chat(client, ep, prompt["messages"], LONG_TOKENS, seed, logprobs=True,
                      extra={"ignore_eos": True} if ignore_eos else None)


def by_position(prompt_id: str, a: Reply, b: Reply) -> list[dict]:
    """One row per position bin of one prompt's two answers (see the module docstring)."""
    first = next((i for i, (x, y) in enumerate(zip(a.tokens, b.tokens, strict=False)) if x != y), None)
    if first is None and len(a.tokens) != len(b.tokens):
        first = min(len(a.tokens), len(b.tokens))
    both = min(len(a.tokens), len(b.tokens))
    rows = []
    for lo, hi, name in BINS:
        span = range(lo, min(hi, both))
        agreed = sum(1 for i in span if a.tokens[i] == b.tokens[i])
        before = range(lo, min(hi, both, first if first is not None else both, len(a.top), len(b.top)))
        kls = [k for k in (drift.kl_topk(a.top[i], b.top[i]) for i in before) if not math.isnan(k)]
        rows.append({"prompt_id": prompt_id, "bin": name, "bin_start": lo, "positions": len(span), "agreed": agreed,
                     "mean_kl": statistics.fmean(kls) if kls else None, "kl_positions": len(kls),
                     "first_divergence": first if first is not None and lo <= first < hi else None})
    return rows


def position_table(rows: list[dict]) -> list[dict]:
    """Per bin over all prompts: positions compared, token agreement, mean KL, answers that first part there."""
    out = []
    for lo, _, name in BINS:
        group = [r for r in rows if r["bin_start"] == lo]
        positions = sum(r["positions"] for r in group)
        kl_n = sum(r["kl_positions"] for r in group)
        kl = sum((r["mean_kl"] or 0.0) * r["kl_positions"] for r in group)
        out.append({"bin": name, "positions": positions,
                    "token_agreement": sum(r["agreed"] for r in group) / positions if positions else None,
                    "mean_kl": kl / kl_n if kl_n else None,
                    "first_divergences": sum(1 for r in group if r["first_divergence"] is not None)})
    return out
