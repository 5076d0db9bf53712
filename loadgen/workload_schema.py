"""The workload file's schema (data/workloads/README.md) as pydantic models, with the options' bounds
(bench/files.py): every length a whole number of tokens in [1, 2**24], every distribution's parameter finite and
in a range a draw can use, every count at least 1. A file that passes is drawn from by the simulator and the load
generator without a NaN, an overflow or a division by zero."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BeforeValidator, Field, model_validator

from bench.files import Count, CountOrZero, NonNegative, Schema, Seed, Text, Tokens, TokensOrZero

KINDS = ("synthetic", "shared_prefix", "long_context", "multi_turn", "agentic_coding", "sharegpt", "trace", "prompts")
NEEDS = {"fixed": ("value",), "uniform": ("min", "max"), "normal": ("mean", "std"), "lognormal": ("median", "sigma"),
         "histogram": ("bins",)}
TokenFloat = Annotated[float, Field(gt=0, le=1 << 24, allow_inf_nan=False)]
# a lognormal's sigma: e**(sigma * z) must stay a float for any draw z (|z| < 40); real request mixes are below 2
Sigma = Annotated[float, Field(ge=0, le=10, allow_inf_nan=False)]
Bin = tuple[TokenFloat, TokenFloat, NonNegative]


class LengthSpec(Schema):
    """A token-length distribution, clipped to [min, max]."""

    dist: Literal["fixed", "uniform", "normal", "lognormal", "histogram"]
    value: Tokens | None = None
    min: Tokens | None = None
    max: Tokens | None = None
    mean: TokenFloat | None = None
    std: Annotated[float, Field(ge=0, le=1 << 24, allow_inf_nan=False)] | None = None
    median: TokenFloat | None = None
    sigma: Sigma | None = None
    bins: Annotated[list[Bin], Field(min_length=1, max_length=10_000)] | None = None

    @model_validator(mode="after")
    def _complete(self) -> LengthSpec:
        missing = [k for k in NEEDS[self.dist] if getattr(self, k) is None]
        if missing:
            raise ValueError(f"a {self.dist} length needs {', '.join(missing)}")
        if self.min is not None and self.max is not None and self.min > self.max:
            raise ValueError(f"min {self.min} is above max {self.max}")
        if self.bins is not None:
            if any(lo > hi for lo, hi, _ in self.bins):
                raise ValueError("histogram bins are [lo, hi, weight] with lo <= hi")
            if not sum(w for _, _, w in self.bins) > 0:
                raise ValueError("histogram bins need a weight above 0")
        return self


def _number_is_fixed(value: object) -> object:
    if isinstance(value, int | float) and not isinstance(value, bool):
        return {"dist": "fixed", "value": value}
    return value


Length = Annotated[LengthSpec, BeforeValidator(_number_is_fixed)]  # N or {dist: ..., ...}


class WorkloadSpec(Schema):
    """One workload file. Type options are accepted for every type (a file may keep them while trying types)."""

    name: Annotated[str, Field(min_length=1, max_length=200)] | None = None
    description: Text = ""
    type: Literal[KINDS] = "synthetic"
    api: Literal["chat", "completions", "embeddings"] = "chat"
    seed: Seed = 0
    ignore_eos: bool = True
    input: Length = 256
    output: Length = 128
    groups: Count | None = None  # shared_prefix, multi_turn
    system_tokens: TokensOrZero | None = None
    questions: CountOrZero | None = None
    concurrent_sessions: Count | None = None  # multi_turn, agentic_coding
    turns: Annotated[int, Field(ge=1, le=1000)] | None = None
    tool_output: Length | None = None  # agentic_coding
    path: Annotated[str, Field(min_length=1, max_length=4096)] | None = None  # sharegpt, trace, prompts
    timestamp_unit: Literal["ms", "s"] | None = None  # prompts: the rows' timestamps (default ms)
    max_output_tokens: Tokens | None = None  # sharegpt
    shuffle: bool | None = None
    block_tokens: Tokens | None = None  # trace
    loop: Literal["open", "closed"] | None = None  # multi_turn, agentic_coding: closed waits for each answer
    think_s: NonNegative | dict | None = None  # multi_turn, agentic_coding: checked by loadgen/sessions.py
