"""Terminal views of capacity figures (rich tables)."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from bench.capacity import Capacity

GB = 1e9


def _tokens(n: int) -> str:
    return f"{n:,}"


def _ratio(cap: Capacity, key: str) -> str:
    r = cap.ratios.get(key)
    return "" if r is None or abs(r - 1) < 1e-9 else f" ({r:.2f}x)"


def _gain(value: float, base: float) -> str:
    return f"{value / base:.2f}x" if base else "-"


def capacity_table(cap: Capacity) -> Table:
    gpus = f"{cap.tp} x {cap.gpu}" + (f" on {cap.nodes} nodes" if cap.nodes > 1 else "")
    table = Table(title=f"{cap.model} on {gpus}, tp {cap.tp}, dp-attention {cap.dp}", show_header=False)
    table.add_column("figure", style="bold")
    table.add_column("value", justify="right")
    rows = [
        ("KV dtype / weights", f"{cap.kv_dtype} / {cap.weights}"),
        ("mem_fraction_static", f"{cap.mem_fraction_static:.3f}"),
        ("weights per GPU", f"{cap.weight_bytes_per_gpu / GB:.1f} GB" + _ratio(cap, "weight_bytes_per_gpu")),
        ("KV bytes per token per GPU", f"{cap.kv_bytes_per_token_per_gpu:,}"),
        ("KV budget per GPU", f"{cap.kv_budget_bytes_per_gpu / GB:.1f} GB"),
        ("KV pool tokens (max_total_num_tokens)", _tokens(cap.kv_pool_tokens) + _ratio(cap, "kv_pool_tokens")),
        ("max_running_requests", _tokens(cap.max_running_requests)),
        (f"concurrent sequences at {cap.context:,} tokens",
         _tokens(cap.max_concurrent_sequences_at_context) + _ratio(cap, "max_concurrent_sequences_at_context")),
        ("longest single context", _tokens(cap.longest_context)),
        ("fits", "yes" if cap.fits else f"NO: short by {cap.short_by_bytes_per_gpu / GB:.1f} GB per GPU"),
    ]
    if cap.dp > 1:
        rows.insert(6, ("KV pool tokens, all dp ranks", _tokens(cap.kv_pool_tokens_total)))
    for name, value in rows:
        table.add_row(name, value)
    return table


def compare_table(caps: list[Capacity]) -> Table:
    first = caps[0]
    table = Table(title=f"{first.model} on {first.tp} x {first.gpu}: KV dtype x expert weights "
                        f"(gains against {first.kv_dtype} KV with {first.weights} weights)")
    for col in ("weights", "KV", "weights/GPU GB", "KV pool tokens", "gain",
                f"seqs at {first.context:,}", "gain", "fits"):
        table.add_column(col, justify="right" if col not in ("weights", "KV") else "left")
    base = caps[0]
    for cap in caps:
        table.add_row(cap.weights, cap.kv_dtype, f"{cap.weight_bytes_per_gpu / GB:.1f}",
                      _tokens(cap.kv_pool_tokens), _gain(cap.kv_pool_tokens, base.kv_pool_tokens),
                      _tokens(cap.max_concurrent_sequences_at_context),
                      _gain(cap.max_concurrent_sequences_at_context, base.max_concurrent_sequences_at_context),
                      "yes" if cap.fits else "no")
    return table


def print_tables(*tables: Table) -> None:
    console = Console(width=max(Console().width, 120))
    for t in tables:
        console.print(t)
