"""What prompts are made of: token-length distributions, a seeded corpus of common English words (about one token
each in the usual BPE vocabularies), independent seeded generators, and the request a workload builds."""

from __future__ import annotations

import hashlib
import math
import random
from dataclasses import dataclass, field

from bench import files
from loadgen.workload_schema import LengthSpec

DEFAULT_TOOL_OUTPUT = {"dist": "lognormal", "median": 1200, "sigma": 0.7, "min": 50, "max": 16000}

_WORDS = (
    "the of and to in is you that it he was for on are as with his they at be this have from or one had by word "
    "but not what all were we when your can said there use an each which she do how their if will up other about "
    "out many then them these so some her would make like him into time has look two more write go see number no "
    "way could people my than first water been call who oil its now find long down day did get come made may part "
    "over new sound take only little work know place year live me back give most very after thing our just name "
    "good sentence man think say great where help through much before line right too mean old any same tell boy "
    "follow came want show also around form three small set put end does another well large must big even such "
    "because turn here why ask went men read need land different home us move try kind hand picture again change "
    "off play spell air away animal house point page letter mother answer found study still learn should world"
).split()


class WorkloadError(ValueError):
    """A workload file or option that cannot be used."""


@dataclass(frozen=True)
class RequestSpec:
    """One request to send: `api` is 'chat' or 'completions'; `body` is the JSON body less model/stream."""

    api: str
    body: dict
    kind: str
    input_tokens: int  # asked for; the server's usage says what it was


# ---- lengths -------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Lengths:
    """A token-length distribution: fixed, uniform, normal, lognormal or histogram, clipped to [min, max]."""

    dist: str = "fixed"
    params: dict = field(default_factory=dict)

    @classmethod
    def parse(cls, spec: int | dict | LengthSpec, where: str = "length") -> Lengths:
        """N tokens or {dist: ..., ...}, checked by the workload schema (loadgen/workload_schema.py)."""
        if isinstance(spec, int | float) and not isinstance(spec, bool):
            spec = {"dist": "fixed", "value": spec}
        if not isinstance(spec, LengthSpec):
            parsed, wrong = files.problems(LengthSpec, spec, where)
            if wrong:
                raise WorkloadError("\n".join(wrong))
            spec = parsed
        return cls(spec.dist, {k: v for k, v in spec.model_dump(exclude_none=True).items() if k != "dist"})

    def sample(self, rng: random.Random) -> int:
        p = self.params
        if self.dist == "fixed":
            v = p["value"]
        elif self.dist == "uniform":
            v = rng.randint(int(p["min"]), int(p["max"]))
        elif self.dist == "normal":
            v = rng.gauss(p["mean"], p["std"])
        elif self.dist == "lognormal":
            v = math.exp(rng.gauss(math.log(p["median"]), p["sigma"]))
        else:
            lo, hi, _ = rng.choices(p["bins"], weights=[b[2] for b in p["bins"]])[0]
            v = rng.uniform(lo, hi)
        v = max(int(p.get("min", 1)), min(int(round(v)), int(p.get("max", 1 << 20))))
        return max(1, v)

    def mean(self) -> float:
        rng = random.Random(0)
        return sum(self.sample(rng) for _ in range(400)) / 400


_CORPUS_WORDS = 1 << 18
_corpus: tuple[str, list[int]] | None = None


def corpus() -> tuple[str, list[int]]:
    """A fixed seeded stream of words and each word's start offset; prompts are slices of it. Built once a process
    (about 0.1 s): Plan builds it before a run starts, not inside the first request."""
    global _corpus
    if _corpus is None:
        words = random.Random(12345).choices(_WORDS, k=_CORPUS_WORDS)
        starts, pos = [], 0
        for w in words:
            starts.append(pos)
            pos += len(w) + 1
        starts.append(pos)
        _corpus = (" ".join(words) + " ", starts)
    return _corpus


def text(rng: random.Random, tokens: int) -> str:
    """`tokens` words from a seeded offset of the corpus (a slice: cheap even for 256k-token prompts)."""
    words, starts = corpus()
    parts, left = [], max(1, tokens)
    while left > 0:
        n = min(left, _CORPUS_WORDS // 2)
        o = rng.randrange(_CORPUS_WORDS - n)
        parts.append(words[starts[o] : starts[o + n] - 1])
        left -= n
    return " ".join(parts)


def seeded(*parts: object) -> random.Random:
    """An independent generator for one (seed, purpose, index) tuple."""
    key = hashlib.blake2b(repr(parts).encode(), digest_size=8).digest()
    return random.Random(int.from_bytes(key, "little"))


