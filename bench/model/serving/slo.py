"""The SLO: bounds on TTFT, TPOT and end-to-end latency, written once as `ttft=2s,tpot=50ms,e2e=30s,p=90`.

One definition serves two questions:
- a request meets it (goodput, SLO attainment of a run) when it succeeded and each bound that is set holds for it;
  a one-token answer has no TPOT and passes the TPOT bound;
- a load meets it (the highest rate within the SLO: simulate --sweep, the plan) when the p-th percentile of each
  bounded metric over the requests holds (p = 50, 90 or 99; 90 unless said).
Units: `s` or `ms`; a bare number is seconds. Keys may come in any order; any of them may be left out.
"""

from __future__ import annotations

from dataclasses import dataclass

from bench.errors import BadInput

PERCENTILES = (50, 90, 99)
SYNTAX = "ttft=2s,tpot=50ms[,e2e=30s][,p=90] (p: 50, 90 or 99)"


@dataclass(frozen=True)
class Slo:
    ttft_s: float | None = None
    tpot_s: float | None = None
    e2e_s: float | None = None
    percentile: int = 90

    def __post_init__(self) -> None:
        for key in ("ttft_s", "tpot_s", "e2e_s"):
            value = getattr(self, key)
            if value is not None and not value > 0:
                raise BadInput(f"SLO bound {key.removesuffix('_s')} must be a positive duration, got {value!r}")
        if self.percentile not in PERCENTILES:
            raise BadInput(f"SLO percentile must be 50, 90 or 99, got {self.percentile}")

    @property
    def bounded(self) -> bool:
        return any(v is not None for v in (self.ttft_s, self.tpot_s, self.e2e_s))

    def met_by_request(self, ttft_s: float | None, tpot_s: float | None, e2e_s: float | None) -> bool:
        """One successful request: every bound that is set holds (no TPOT, a one-token answer, passes)."""
        return ((self.ttft_s is None or (ttft_s is not None and ttft_s <= self.ttft_s))
                and (self.tpot_s is None or tpot_s is None or tpot_s <= self.tpot_s)
                and (self.e2e_s is None or (e2e_s is not None and e2e_s <= self.e2e_s)))

    def met(self, point: object) -> bool:
        """A load: `point` has ttft_pNN, tpot_pNN and e2e_pNN attributes (seconds), as simulate.Point does."""
        q = self.percentile
        return all(bound is None or getattr(point, f"{metric}_p{q}") <= bound
                   for metric, bound in (("ttft", self.ttft_s), ("tpot", self.tpot_s), ("e2e", self.e2e_s)))

    def scaled(self, factor: float) -> Slo:
        """Every bound divided by `factor` (a twin `factor` times faster than the GPUs it models)."""
        return Slo(*(None if v is None else v / factor for v in (self.ttft_s, self.tpot_s, self.e2e_s)),
                   percentile=self.percentile)

    def text(self) -> str:
        """The SLO as it is written on a command line."""
        parts = [f"{k}={_duration(v)}" for k, v in (("ttft", self.ttft_s), ("tpot", self.tpot_s),
                                                     ("e2e", self.e2e_s)) if v is not None]
        return ",".join(parts + [f"p={self.percentile}"])

    def describe(self) -> str:
        """e.g. 'TTFT p90 <= 2 s, TPOT p90 <= 50 ms'."""
        q = self.percentile
        parts = [f"{name} p{q} <= {_duration(v, ' ')}" for name, v in (("TTFT", self.ttft_s), ("TPOT", self.tpot_s),
                                                                        ("E2E", self.e2e_s)) if v is not None]
        return ", ".join(parts) or "no latency bound"


def _duration(seconds: float, sep: str = "") -> str:
    return f"{seconds * 1e3:g}{sep}ms" if seconds < 1 else f"{seconds:g}{sep}s"


def parse_duration(value: str) -> float:
    """'2s' -> 2.0, '50ms' -> 0.05, '1.5' -> 1.5 (seconds)."""
    v = value.strip().lower()
    try:
        if v.endswith("ms"):
            return float(v[:-2]) / 1000
        return float(v.removesuffix("s"))
    except ValueError:
        raise BadInput(f"not a duration: {value!r} (say 2s or 50ms)") from None


def parse_slo(text: str | None) -> Slo:
    """'ttft=2s,tpot=50ms,e2e=30s,p=90' -> Slo; None or '' -> no bound."""
    values: dict = {}
    for part in filter(None, (p.strip() for p in (text or "").split(","))):
        key, sep, value = part.partition("=")
        key = key.strip().lower()
        if not sep or not value.strip() or key not in ("ttft", "tpot", "e2e", "p"):
            raise BadInput(f"bad --slo part {part!r}; expected {SYNTAX}")
        if key == "p":
            try:
                values["percentile"] = int(value.strip().lower().removeprefix("p"))
            except ValueError:
                raise BadInput(f"bad --slo percentile {value!r}; expected {SYNTAX}") from None
        else:
            values[f"{key}_s"] = parse_duration(value)
    return Slo(**values)
