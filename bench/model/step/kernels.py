"""Latencies of SGLang's operators read off the measured kernel tables (data/kernels/, README there): one layer's
attention, MoE, dense GEMM or communication on one GPU, interpolated in log space over tokens, batch and context.

Every lookup answers (seconds, source). The source names the table row set it came from (GPU, SGLang version,
kernel), says when the SGLang version asked for has no table ("0.5.23: priced on 0.5.14's table", the nearest
version not newer, else the oldest), when a point lies beyond the table's range ("extrapolated"), and when a shape
was borrowed from a measured one ("scaled from ..."). A lookup with no table answers None: the caller prices the
operator with the roofline and says "no kernel measurement for ...: roofline" (NO_TABLE).
"""

from __future__ import annotations

import math
from bisect import bisect_left
from dataclasses import dataclass
from functools import cache

import pyarrow.compute as pc
import pyarrow.parquet as pq

from bench.model.fits.catalog import DATA, Model

KERNELS = DATA / "kernels"
DEFAULT_SGLANG = "0.5.23"  # the version plans are for (SGLang's default backend choice is read off 0.5.23)
# capbench's expert / weight formats as the tables' dtype column names them
DTYPES = {"bf16": "bfloat16", "fp8-block128": "fp8_block", "fp8": "fp8", "int4-g32": "int4_wo", "int4-g128": "int4_wo",
          "nvfp4": "nvfp4", "mxfp4": "w4a16_mxfp4", "mxfp4-w4a16": "w4a16_mxfp4", "mxfp4-w4a8": "w4a8_mxfp4_mxfp8"}
# MoE shapes measured for borrowing: the catalog's (hidden, inter, experts, top-k) that were not collected
NOT_KERNELS = ("situ_as_silu",)  # variants of a kernel for another activation
BEYOND = 2.0  # a MoE step past this many times the table's largest token count is priced by the roofline


def no_table(what: str) -> str:
    return f"no kernel measurement for {what}: roofline"


def vkey(v: str) -> tuple:
    return tuple(int(p) if p.isdigit() else -1 for p in v.replace(".post", ".").split("."))


@cache
def _table(name: str):
    path = KERNELS / f"{name}.parquet"
    return pq.read_table(path) if path.is_file() else None


def load_tables() -> None:
    """Read every kernel table now: a search reads them before it forks its workers, which then share them."""
    for name in ("attention", "moe", "gemm", "comm"):
        _table(name)


@cache
def versions(gpu: str, name: str) -> tuple[str, ...]:
    t = _table(name)
    if t is None:
        return ()
    return tuple(sorted(set(t.filter(pc.equal(t["gpu"], gpu))["sglang"].to_pylist()), key=vkey))


@cache
def resolve(gpu: str, name: str, version: str | None) -> tuple[str | None, str]:
    """The table version that prices `version` on `gpu`: the nearest not newer, else the oldest; and what to say."""
    return pick(versions(gpu, name), version)


def pick(have: tuple[str, ...], version: str | None) -> tuple[str | None, str]:
    """Of the versions that measured a series, the nearest not newer than `version`, else the oldest."""
    if not have:
        return None, ""
    want = version or DEFAULT_SGLANG
    if want in have:
        return want, ""
    older = [v for v in have if vkey(v) <= vkey(want)]
    if older:
        return older[-1], f"SGLang {want} priced on {older[-1]}'s table"
    return have[0], f"no table as old as SGLang {want}: priced on {have[0]}'s"


@dataclass(frozen=True)
class Curve:
    """y(x) from measured points, interpolated linearly in (log x, log y); extrapolated along the end segments.
    inside: the (log x) range where it is measured, when that is not lx's ends (a Surface's slice)."""
    lx: tuple[float, ...]
    ly: tuple[float, ...]
    inside: tuple[float, float] | None = None

    @classmethod
    def of(cls, xs, ys) -> Curve:
        pts = sorted({float(x): float(y) for x, y in zip(xs, ys, strict=True) if x > 0 and y > 0}.items())
        return cls(tuple(math.log(x) for x, _ in pts), tuple(math.log(y) for _, y in pts))

    def log_at(self, t: float) -> float:  # log y at log x = t
        lx, ly = self.lx, self.ly
        if len(lx) == 1:
            return ly[0]
        i = min(max(bisect_left(lx, t), 1), len(lx) - 1)
        return ly[i - 1] + (t - lx[i - 1]) / (lx[i] - lx[i - 1]) * (ly[i] - ly[i - 1])

    def __call__(self, x: float) -> tuple[float, bool]:
        t = math.log(max(x, 1e-9))
        lo, hi = self.inside or (self.lx[0], self.lx[-1])
        return math.exp(self.log_at(t)), t < lo or t > hi

    @property
    def span(self) -> tuple[float, float]:
        return math.exp(self.lx[0]), math.exp(self.lx[-1])


def blend(c0: Curve, c1: Curve, w: float) -> Curve:
    """The curve whose log y is c0's + w x (c1's - c0's) at every x: piecewise linear in log x on the union of their
    points, so one lookup prices what two did (a Surface at one a; a decode span asks one batch size thousands of
    times). Measured where both are."""
    lx = tuple(sorted(set(c0.lx) | set(c1.lx)))
    ly = tuple(c0.log_at(t) + w * (c1.log_at(t) - c0.log_at(t)) for t in lx)
    ins = [c.inside or (c.lx[0], c.lx[-1]) for c in (c0, c1)]
    return Curve(lx, ly, (max(ins[0][0], ins[1][0]), min(ins[0][1], ins[1][1])))


@dataclass(frozen=True)
class Surface:
    """y(a, b): a Curve over b for each measured a, interpolated in log a between the two either side."""
    a: tuple[float, ...]
    curves: tuple[Curve, ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "la", [math.log(x) for x in self.a])
        object.__setattr__(self, "_at", {})  # a -> its slice and whether a is outside the table

    def at(self, a: float) -> tuple[Curve, bool]:
        """The surface at one a, as a curve over b, and whether a lies outside the measured a."""
        hit = self._at.get(a)
        if hit is None:
            la, c, t = self.la, self.curves, math.log(max(a, 1e-9))
            i = min(max(bisect_left(la, t), 1), len(la) - 1)
            hit = self._at[a] = (c[0], a != self.a[0]) if len(la) == 1 else \
                (blend(c[i - 1], c[i], (t - la[i - 1]) / (la[i] - la[i - 1])), t < la[0] or t > la[-1])
        return hit

    def __call__(self, a: float, b: float) -> tuple[float, bool]:
        curve, out = self.at(a)
        y, o = curve(b)
        return y, o or out


@cache
def _measured(name: str, gpu: str, sglang: str):
    """One GPU's rows of one SGLang version: a search asks the table hundreds of times, each for one of these."""
    t = _table(name)
    return t.filter(pc.and_(pc.equal(t["gpu"], gpu), pc.equal(t["sglang"], sglang)))


def _rows(name: str, **eq) -> dict[str, list]:
    t = _table(name)
    if t is None:
        return {}
    if "gpu" in eq and "sglang" in eq:
        t = _measured(name, eq.pop("gpu"), eq.pop("sglang"))
        if not eq:
            return t.to_pydict()
    mask = None
    for col, val in eq.items():
        m = pc.equal(t[col], val)
        mask = m if mask is None else pc.and_(mask, m)
    return t.filter(mask).to_pydict()


def _surface(rows: dict[str, list], a: str, b: str) -> Surface | None:
    if not rows or not rows["latency_ms"]:
        return None
    by: dict[float, tuple[list, list]] = {}
    for av, bv, y in zip(rows[a], rows[b], rows["latency_ms"], strict=True):
        by.setdefault(av, ([], []))[0].append(bv)
        by[av][1].append(y * 1e-3)
    keys = sorted(by)
    return Surface(tuple(float(k) for k in keys), tuple(Curve.of(*by[k]) for k in keys))


def _say(parts: list[str], out: bool) -> str:
    return "; ".join([p for p in parts if p] + (["extrapolated beyond the table"] if out else []))


# ---- attention
@cache
def _attention(gpu: str, version: str, kind: str, phase: str, backend: str, kv: str, heads: int,
               kv_heads: int) -> Surface | None:
    return _surface(_rows("attention", gpu=gpu, sglang=version, attention=kind, phase=phase, backend=backend,
                          kv_dtype=kv, heads=heads, kv_heads=kv_heads), "batch", "length")


def attention_time(model: Model, gpu: str, backend: str, kv_dtype: str, phase: str, batch: float, length: float,
                   attn_tp: int, version: str | None = None) -> tuple[float, str] | None:
    """One layer's attention of `batch` sequences of `length` tokens (decode: KV tokens each; prefill: new tokens
    each, no cached prefix) on one GPU of an attention-TP group of attn_tp. None: no table for it."""
    series = attention_surface(model, gpu, backend, kv_dtype, phase, attn_tp, version)
    if series is None:
        return None
    s, label = series
    y, out = s(max(batch, 1), max(length, 1))
    return y, label + ("; extrapolated beyond the table" if out else "")


def attention_surface(model: Model, gpu: str, backend: str, kv_dtype: str, phase: str, attn_tp: int,
                      version: str | None = None) -> tuple[Surface, str] | None:
    """attention_time's measured surface over (batch, length) and where it comes from; None: no table for it."""
    heads = model.attention_heads // attn_tp
    kv_heads = 1 if model.attention == "mla" else max(1, model.kv_heads // attn_tp)
    kv = "fp8_e4m3" if kv_dtype.startswith("fp8") else "bf16"
    return _attention_series(gpu, model.attention, phase, backend, kv, heads, kv_heads, version)


@cache
def _attention_series(gpu: str, kind: str, phase: str, backend: str, kv: str, heads: int, kv_heads: int,
                      version: str | None) -> tuple[Surface, str] | None:
    have = tuple(x for x in versions(gpu, "attention")
                 if _attention(gpu, x, kind, phase, backend, kv, heads, kv_heads) is not None)
    v, said = pick(have, version)
    if v is None:
        return None
    return (_attention(gpu, v, kind, phase, backend, kv, heads, kv_heads),
            _say([f"{gpu} SGLang {v} {backend} {kind} {phase} {kv} KV", said], False))


# ---- MoE
@cache
def _moe(gpu: str, version: str, dtype: str, shape: tuple[int, int, int, int], moe_tp: int, moe_ep: int
         ) -> tuple[Curve, str] | None:
    h, i, e, k = shape
    rows = _rows("moe", gpu=gpu, sglang=version, dtype=dtype, hidden=h, inter=i, experts=e, topk=k, moe_tp=moe_tp,
                 moe_ep=moe_ep)
    if not rows or not rows["tokens"]:
        return None
    counts: dict[str, int] = {}
    for kern in rows["kernel"]:
        if not any(x in kern for x in NOT_KERNELS):
            counts[kern] = counts.get(kern, 0) + 1
    if not counts:
        return None
    kernel = max(counts, key=lambda x: (counts[x], x))  # the kernel the collector ran across the whole sweep
    pts = [(t, y * 1e-3) for t, y, kk in zip(rows["tokens"], rows["latency_ms"], rows["kernel"], strict=True)
           if kk == kernel]
    return Curve.of([p[0] for p in pts], [p[1] for p in pts]), kernel


@cache
def _shapes(gpu: str, version: str, dtype: str) -> tuple[tuple[int, int, int, int], ...]:
    rows = _rows("moe", gpu=gpu, sglang=version, dtype=dtype)
    if not rows:
        return ()
    return tuple(sorted(set(zip(rows["hidden"], rows["inter"], rows["experts"], rows["topk"], strict=True))))


def moe_time(model: Model, gpu: str, fmt: str, tokens: float, ep: int, tp: int, version: str | None = None
             ) -> tuple[float, str] | None:
    """One layer's routed experts for a step of `tokens` tokens (before routing) on one GPU of a tp-GPU instance
    with expert parallelism ep (moe_tp = tp / ep), in expert format `fmt` (capbench's name: bf16, fp8-block128,
    int4-g32, nvfp4, mxfp4...). A model whose own shape was not measured borrows the nearest measured shape of the
    same top-k at equal tokens per expert, scaled by its experts' weights (said). None: no table for it."""
    shape = (model.hidden_size, model.moe_intermediate_size, model.routed_experts, model.experts_per_token)
    series = _moe_series(gpu, DTYPES.get(fmt, fmt), shape, max(1, tp // max(ep, 1)), max(ep, 1), version)
    if series is None:
        return None
    curve, scale, per_expert, label = series
    x = max(tokens * per_expert, 1)
    if x > BEYOND * curve.span[1]:
        return None  # far past the largest step measured (wide-EP prefill): not this table's regime
    y, out = curve(x)
    return y * scale, label + ("; extrapolated beyond the table" if out else "")


@cache
def _moe_series(gpu: str, dtype: str, shape: tuple[int, int, int, int], moe_tp: int, moe_ep: int,
                version: str | None) -> tuple[Curve, float, float, str] | None:
    """(curve over tokens, latency scale, tokens scale, label) of the series that prices this MoE."""
    every = versions(gpu, "moe")
    exact = tuple(x for x in every if _moe(gpu, x, dtype, shape, moe_tp, moe_ep) is not None)
    scale, note, donor = 1.0, "", shape
    if exact:
        v, said = pick(exact, version)
    else:  # borrow the nearest measured shape of the same top-k, at equal tokens per expert
        size = shape[0] * shape[1] * shape[2]
        near = sorted({s for x in every for s in _shapes(gpu, x, dtype) if s[3] == shape[3]},
                      key=lambda s: abs(math.log(s[0] * s[1] * s[2] / size)))
        donor = next((s for s in near if any(_moe(gpu, x, dtype, s, moe_tp, moe_ep) for x in every)), None)
        if donor is None:
            return None
        v, said = pick(tuple(x for x in every if _moe(gpu, x, dtype, donor, moe_tp, moe_ep)), version)
        scale = size / (donor[0] * donor[1] * donor[2])
        note = f"scaled from the measured {donor[0]}x{donor[1]} x {donor[2]} experts shape"
    curve, kernel = _moe(gpu, v, dtype, donor, moe_tp, moe_ep)
    return curve, scale, donor[2] / shape[2], _say([f"{gpu} SGLang {v} {kernel} {dtype} moe_tp {moe_tp} "
                                                     f"moe_ep {moe_ep}", note, said], False)


# ---- dense GEMM
@cache
def _gemm_grid(gpu: str, version: str, dtype: str) -> tuple[dict[tuple[int, int], Curve], list[int], list[int]]:
    rows = _rows("gemm", gpu=gpu, sglang=version, dtype=dtype)
    by: dict[tuple[int, int], tuple[list, list]] = {}
    for m, n, k, y in zip(rows.get("m", []), rows.get("n", []), rows.get("k", []), rows.get("latency_ms", []),
                          strict=True):
        by.setdefault((n, k), ([], []))[0].append(m)
        by[(n, k)][1].append(y * 1e-3)
    return {nk: Curve.of(*xy) for nk, xy in by.items()}, sorted({a for a, _ in by}), sorted({b for _, b in by})


@cache
def _gemm_version(gpu: str, dtype: str, version: str | None) -> tuple[str | None, str]:
    return pick(tuple(x for x in versions(gpu, "gemm") if _gemm_grid(gpu, x, dtype)[0]), version)


def _either_side(grid: list[int], x: float) -> tuple[int, int]:
    i = bisect_left(grid, x)
    if i < len(grid) and grid[i] == x:
        return grid[i], grid[i]
    return grid[max(i - 1, 0)], grid[min(i, len(grid) - 1)]


def gemm_time(gpu: str, fmt: str, m: float, n: int, k: int, version: str | None = None) -> tuple[float, str] | None:
    """A dense GEMM of m rows, n output columns and depth k on one GPU: bilinear in (log n, log k) over the measured
    grid, log-log in m. None: no table for this format on this GPU."""
    dtype = DTYPES.get(fmt, fmt)
    v, said = _gemm_version(gpu, dtype, version)
    if v is None or m <= 0:
        return None
    grid, ns, ks = _gemm_grid(gpu, v, dtype)
    if not grid:
        return None
    n0, n1 = _either_side(ns, n)
    k0, k1 = _either_side(ks, k)
    if not all((a, b) in grid for a in (n0, n1) for b in (k0, k1)):
        return None
    out = not (n0 <= n <= n1 and k0 <= k <= k1)

    def at(a: int, b: int) -> float:
        y, o = grid[(a, b)](m)
        nonlocal out
        out = out or o
        return math.log(y)

    wn = 0.0 if n0 == n1 else (math.log(n) - math.log(n0)) / (math.log(n1) - math.log(n0))
    wk = 0.0 if k0 == k1 else (math.log(k) - math.log(k0)) / (math.log(k1) - math.log(k0))
    ly = ((1 - wn) * ((1 - wk) * at(n0, k0) + wk * at(n0, k1)) + wn * ((1 - wk) * at(n1, k0) + wk * at(n1, k1)))
    return math.exp(ly), _say([f"{gpu} SGLang {v} {dtype} GEMM", said], out)


# ---- communication
@cache
def _allreduce(gpu: str, version: str, gpus: int, graph: bool) -> tuple[Curve, str] | None:
    rows = _rows("comm", gpu=gpu, sglang=version, op="all_reduce", gpus=gpus)
    if not rows or not rows["bytes"]:
        return None
    kernels = sorted(set(rows["kernel"]))
    want = [x for x in kernels if x.endswith("_graph" if graph else "_eager")] or kernels
    kernel = want[0]
    pts = [(b, y * 1e-3) for b, y, kk in zip(rows["bytes"], rows["latency_ms"], rows["kernel"], strict=True)
           if kk == kernel]
    return Curve.of([p[0] for p in pts], [p[1] for p in pts]), kernel


def allreduce_time(gpu: str, gpus: int, nbytes: float, graph: bool = True, version: str | None = None
                   ) -> tuple[float, str] | None:
    """SGLang's custom all-reduce of nbytes over `gpus` GPUs of one node (graph: inside a CUDA graph)."""
    if gpus <= 1 or nbytes <= 0:
        return 0.0, ""
    v, said = _allreduce_version(gpu, gpus, graph, version)
    got = _allreduce(gpu, v, gpus, graph) if v else None
    if got is None:
        return None
    curve, kernel = got
    y, out = curve(nbytes)
    return y, _say([f"{gpu} SGLang {v} {kernel} over {gpus}", said], out)


@cache
def _allreduce_version(gpu: str, gpus: int, graph: bool, version: str | None) -> tuple[str | None, str]:
    return pick(tuple(x for x in versions(gpu, "comm") if _allreduce(gpu, x, gpus, graph)), version)


@cache
def _deepep(gpu: str, version: str, op: str, hidden: int, experts: int) -> Curve | None:
    rows = _rows("comm", gpu=gpu, sglang=version, op=op, hidden=hidden, experts=experts)
    if not rows or not rows["tokens"]:
        return None
    best: dict[int, float] = {}
    for t, y in zip(rows["tokens"], rows["latency_ms"], strict=True):  # normal mode: the best SM count measured
        best[t] = min(best.get(t, math.inf), y * 1e-3)
    return Curve.of(list(best), list(best.values()))


def deepep_time(model: Model, gpu: str, tokens: float, low_latency: bool, version: str | None = None
                ) -> tuple[float, str] | None:
    """DeepEP dispatch + combine of `tokens` tokens per rank within one node (8 GPUs) for one layer."""
    op = "deepep_ll" if low_latency else "deepep_normal"
    v, said = pick(tuple(x for x in versions(gpu, "comm") if _deepep(gpu, x, op, model.hidden_size,
                                                                     model.routed_experts)), version)
    if v is None:
        return None
    y, out = _deepep(gpu, v, op, model.hidden_size, model.routed_experts)(max(tokens, 1))
    return y, _say([f"{gpu} SGLang {v} DeepEP {op[7:]}", said], out)
