"""The expert-formats table (bench/model/format_table.py) for the terminal and as a report section: one row per
format, then the why of every format the planner does not search, then the kernels' source files and the accuracy
evidence."""

from __future__ import annotations

from rich import box
from rich.table import Table

from bench.model import format_table
from bench.report import wording


def _num(v: float | None, fmt: str) -> str:
    return "-" if v is None else format(v, fmt)


def table(rows: list[format_table.FormatRow], title: str) -> Table:
    t = Table(title=title, box=box.SIMPLE_HEAD, title_justify="left")
    for col in ("format", "bytes/w", "GB/GPU", "KV tokens", "seqs@ctx", "tok/s/GPU", "$/1M", "kernel file",
                "checkpoint", "planner"):
        t.add_column(col, justify="left" if col in ("format", "kernel file", "checkpoint", "planner") else "right",
                     no_wrap=True)
    for r in rows:
        p = r.priced
        fits = r.fits
        t.add_row(
            f"{r.format}" + (f" (ep{r.ep})" if r.ep > 1 else ""), f"{r.bytes_per_weight:.4f}",
            f"{r.weight_gb_per_gpu:,.1f}", f"{r.kv_pool_tokens:,}" if fits else "does not fit",
            f"{r.seqs_at_context:,}" if fits else "-",
            _num(p.output_tps_per_gpu if p and p.rate_rps > 0 else None, ",.0f"),
            _num(p.usd_per_m_output if p else None, ",.2f"),
            r.kernel_file.rsplit("/", 1)[-1] if r.kernel_file else f"none on {r.kernel.split()[-1]}",
            r.checkpoint_short, r.status)
    return t


def notes(rows: list[format_table.FormatRow]) -> list[str]:
    out = ["Checkpoints:"] + [f"- {r.format}: {r.checkpoint}" for r in rows if r.obtainable]
    out.append("Not searched by the planner:")
    out += [f"- {r.format}: {r.why_not}" for r in rows if r.why_not]
    out.append("Kernels (under the installed sglang package):")
    out += [f"- {r.format}: {r.kernel} ({r.kernel_file})" for r in rows if r.kernel_file]
    out.append("Priced by:")
    out += [f"- {r.format}: {r.priced.method}" for r in rows if r.priced]
    out.append("Accuracy evidence:")
    out += [f"- {r.format}: {r.accuracy}" for r in rows]
    return out


def formats_section(rows: list) -> tuple[list[str], list[list[str]]]:
    """The `capbench formats` table as a report section (the same rows, bench/model/format_table.py)."""
    head = ["expert format", "bytes per weight", "weights per GPU", "KV pool tokens", "sequences at context",
            "output tok/s per GPU", "$ per 1M output", "SGLang kernel", "checkpoint", "planner", "accuracy evidence"]
    body = []
    for x in rows:
        p = x.priced
        body.append([x.name, f"{x.bytes_per_weight:.4f}", f"{x.weight_gb_per_gpu:,.1f} GB",
                     f"{x.kv_pool_tokens:,}" if x.fits else "does not fit", f"{x.seqs_at_context:,}" if x.fits else "-",
                     _num(p.output_tps_per_gpu if p and p.rate_rps > 0 else None, ",.0f"),
                     wording.money(p.usd_per_m_output if p else None, ",.2f", "-"),
                     f"{x.kernel} ({x.kernel_file})" if x.kernel_file else x.kernel, x.checkpoint,
                     x.status if x.served else f"{x.status}: {x.why_not}", x.accuracy])
    return head, body
