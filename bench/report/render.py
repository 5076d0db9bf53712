"""The capacity report as text: one self-contained HTML page (inline styles and SVG, no script, no external
reference) or Markdown. The content is made in content.py; this module only lays it out."""

from __future__ import annotations

import html
import re
from datetime import UTC, datetime
from pathlib import Path

from bench import __version__
from bench.errors import BadInput
from bench.model import catalog, fit, interval
from bench.report import wording
from bench.report.content import Report, answer_lines, chart_svgs, launch, tables
from bench.report.wording import question_text
from bench.store import replacing

CSS = """
body{font-family:system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;max-width:1100px;margin:2em auto;padding:0 1em;
color:#222;line-height:1.45}
h1{margin-bottom:.2em}h2{border-bottom:1px solid #ddd;padding-bottom:.2em;margin-top:1.8em}
.meta{color:#666;font-size:.9em}.answer{background:#eef7ee;border-left:4px solid #3a8a3a;padding:.6em 1em}
.warn{background:#fff6e0;border-left:4px solid #d89a00;padding:.6em 1em}
table{border-collapse:collapse;margin:.8em 0;font-size:.92em}th,td{border:1px solid #ccc;padding:.3em .6em}
th{background:#f4f4f4;text-align:left}td{text-align:right}td:first-child{text-align:left}
pre{background:#f6f8fa;padding:.8em;overflow-x:auto;white-space:pre-wrap;word-break:break-all;font-size:.85em}
.charts{display:flex;flex-wrap:wrap;gap:1em}.charts svg{max-width:100%;height:auto}
"""

SECTIONS = {
    "configs": "Configurations compared",
    "capacity": "Capacity (SGLang 0.5.23 memory arithmetic)",
    "predicted": "Predicted throughput and cost (capbench simulate)",
    "load": "Latency against load (the recommended configuration)",
    "pareto": "Every configuration that meets the SLO: throughput, speed and cost",
    "gpus": "Each other GPU's cheapest configuration (catalog prices)",
    "formats": ("Expert weight formats on this GPU (tok/s and $ per 1M: the performance model, kernel tables where "
                "measured, else the roofline)"),
    "measured": "Measured results",
    "vs": "Predicted vs measured",
    "repeats": "Repeated runs: 90 % intervals across each repeat group",
    "gpu_nodes": "GPUs during the runs (NVML here, or each node's DCGM exporter)",
    "integrity": "KV cache integrity",
}
MEASURE_HOWTO = [
    "capbench twin --model {model} --gpu {gpu} --tp {tp} --kv-dtype {kv}      # no GPU: the SGLang-compatible twin",
    "capbench run --target http://127.0.0.1:30000 --profile poisson --rate {rate:g} --duration 300 "
    "--workload {workload} --slo {slo}",
    "capbench report --model {model} --gpu {gpu} --target-rate {target:g} --out report.html",
]


# what makes a link, an image, HTML, code, emphasis or a new cell (an underscore inside a word, as in fp8_e4m3, cannot)
_MD_SPECIAL = re.compile(r"[\\`*\[\]<>|]|(?<![A-Za-z0-9])_|_(?![A-Za-z0-9])")


def _e(s: object) -> str:
    return html.escape(str(s))


def _html_table(head: list[str], rows: list[list[str]]) -> str:
    th = "".join(f"<th>{_e(h)}</th>" for h in head)
    body = "".join("<tr>" + "".join(f"<td>{_e(c)}</td>" for c in row) + "</tr>" for row in rows)
    return f"<table><thead><tr>{th}</tr></thead><tbody>{body}</tbody></table>"


def _md_table(head: list[str], rows: list[list[str]]) -> str:
    def line(cells: list[str]) -> str:  # cells are text (run labels are the user's): no link, image or HTML
        return "| " + " | ".join(_MD_SPECIAL.sub(r"\\\g<0>", str(c)).replace("\n", " ") for c in cells) + " |"

    return "\n".join([line(head), "|" + "---|" * len(head), *(line(r) for r in rows)])


def _drift_rows(r: Report) -> tuple[list[str], list[list[str]]]:
    def cell(v: object) -> str:
        return f"{v:.3f}" if isinstance(v, float) else str(v)

    return list(map(str, r.drift.columns)), [[cell(v) for v in row] for row in r.drift.itertuples(index=False)]


def _howto(r: Report) -> list[str]:
    q, o = r.plan.question, r.plan.chosen
    return [c.format(model=q.model, gpu=o.config.gpu, tp=o.tp, kv=o.kv_dtype, rate=max(q.target_rate_rps / 4, 0.5),
                     workload=q.workload or "chat", slo=q.slo.text(),
                     target=q.target_rate_rps) for c in MEASURE_HOWTO]


def _intervals() -> str:
    cov = interval.coverage()
    share = ", ".join(f"{f} {c['coverage']:.0%}" for f, c in cov.items())
    return ("Intervals: every predicted figure carries an 80 % interval from the model's out-of-sample errors on the "
            "published corpus, wider where the deployment's regime (GPU family, attention, expert format) has few "
            f"cases; left out one source at a time, {share} of the cases fell inside theirs.")


def _method(r: Report) -> list[str]:
    q, o = r.plan.question, r.plan.recommended or r.plan.chosen
    err = fit.closest_error(q.model, o.config.gpu)
    accuracy = ("Accuracy: no out-of-sample validation has been run (capbench validate --fit)." if err is None else
                f"Accuracy: against published SGLang measurements of {err['basis']} ({err['cases']} cases), predicted "
                f"with factors fitted on other sources: median error {err['output_tok_s']:.0%} on output tokens/s, "
                f"{err['tpot_ms']:.0%} on TPOT, {err['ttft_ms']:.0%} on TTFT. Read every predicted figure as that "
                "uncertain.")
    return [
        "Capacity: SGLang 0.5.23's own arithmetic (cell size, mem_fraction_static, KV pool tokens, "
        "max_running_requests); weight bytes are counted from the architecture (within 3 % of published totals).",
        "Predictions: capbench simulate's continuous-batching scheduler with step times from the performance model "
        "(memory, compute, per-kernel and communication costs, fitted to published SGLang runs: capbench validate); "
        f"the highest Poisson rate whose percentiles meet the SLO ({q.slo.describe()}), simulated until doubling "
        "the horizon moves it by under 5 %. $ per 1M output tokens is at that rate.",
        accuracy,
        _intervals(),
        f"Search: {len(r.plan.options)} configurations (GPU, tp, DP attention, EP, KV dtype, expert weights) sized, "
        f"{len(r.plan.simulated)} simulated; the recommendation serves the target load for the least money.",
        f"Prices: {wording.prices(q)} (indicative list prices from data/gpus.yaml: use your own quotes, "
        "capbench plan --price h200=3.10,b200=5.20); a month is 730 hours.",
        "Prefill/decode disaggregation: the cheapest PD shape is weighed against the colocated answer (the answer "
        "above names the winner); its figures come from an analytic model checked against a handful of published PD "
        "runs, not a calibrated interval.",
        "Not modelled: failures and headroom: add your own margin (20-30 % is common).",
    ]


def _head(title: str) -> str:
    return (f"<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'><title>{_e(title)}</title>"
            f"<style>{CSS}</style></head><body>")


def to_html(r: Report) -> str:
    title = _title(r)
    return "\n".join([_head(f"capbench {title}"), *_body(r, title), "</body></html>"])


def _title(r: Report) -> str:
    """The model and the load asked about: the answer may be on another GPU than the one asked about."""
    q = r.plan.question
    return f"Capacity report: {catalog.model(q.model).name} at {q.target_rate_rps:g} req/s"


def to_html_many(reports: list[Report]) -> str:
    """One page for several models: an index (each model's answer, linked) and a section per model."""
    names = [catalog.model(r.plan.question.model).name for r in reports]
    title = "Capacity report: " + ", ".join(names)
    index = ["<h1>" + _e(title) + "</h1>", "<p class='meta'>One section per model the runs measured.</p>", "<ul>"]
    for r, name in zip(reports, names, strict=True):
        index.append(f"<li><a href='#{_e(r.plan.question.model)}'>{_e(name)}</a>: "
                     f"{_e(answer_lines(r)[0])}</li>")
    parts = [_head(f"capbench {title}"), *index, "</ul>"]
    for r, name in zip(reports, names, strict=True):
        parts += [f"<section id='{_e(r.plan.question.model)}'>",
                  *_body(r, f"{name} at {r.plan.question.target_rate_rps:g} req/s"), "</section>"]
    return "\n".join([*parts, "</body></html>"])


def _body(r: Report, title: str) -> list[str]:
    q, plan = r.plan.question, r.plan
    t, svgs = tables(r), chart_svgs(r)
    single, multi, notes = launch(r)
    when = datetime.fromtimestamp(r.generated_at, UTC).strftime("%Y-%m-%d %H:%M UTC")
    parts = [
        f"<h1>{_e(title)}</h1>",
        f"<p class='meta'>capbench {_e(__version__)}, {when}. Results DB: {_e(r.db or 'none')}.</p>",
        "<h2>The question</h2>", f"<p>{_e(question_text(q))}</p>",
        "<h2>The answer</h2>", "<div class='answer'>" + "".join(f"<p>{_e(x)}</p>" for x in answer_lines(r))
        + "</div>",
    ]
    if not r.measured:
        parts.append(f"<p class='warn'>Nothing was measured: {_e(r.why_unmeasured)}. This is a planning report "
                     "from the capacity and performance models.</p>")
    for key, title in SECTIONS.items():
        if key == "measured" and not r.measured:
            parts += [f"<h2>{title}</h2>", "<p>Nothing was measured. How to measure:</p>",
                      "<pre>" + _e("\n".join(_howto(r))) + "</pre>"]
            continue
        if key == "vs" and not r.measured:
            parts += [f"<h2>{title}</h2>", "<p>No measurements to compare the predictions with.</p>"]
            continue
        shown = {"capacity": ["capacity"], "predicted": ["throughput", "gpus", "cost"], "measured": ["latency"],
                 "vs": ["vs"], "load": ["load"], "pareto": ["curves", "pareto_tps", "pareto_cost"],
                 "gpus": ["gpu_compare"]}.get(key, [])
        if key not in t and not any(k in svgs for k in shown):
            continue
        parts += [f"<h2>{title}</h2>"] + ([_html_table(*t[key])] if key in t else [])
        if key == "measured" and any(m.config.get("twin") for m in r.runs):
            parts.append("<p class='meta'>Twin runs are shown in the modelled GPUs' time: a twin that ran k times "
                         "faster has its rates divided by k and its latencies multiplied by k.</p>")
        svg = [svgs[k] for k in shown if k in svgs]
        if svg:
            parts.append("<div class='charts'>" + "".join(svg) + "</div>")
    for note in plan.notes:
        parts.append(f"<p class='warn'>{_e(note)}</p>")
    if r.drift is not None and not r.drift.empty:
        parts += ["<h2>Quality drift (capbench drift runs)</h2>", _html_table(*_drift_rows(r))]
    parts += ["<h2>Launch commands (SGLang 0.5.23 with capbench's patches)</h2>"]
    head = r.headline
    if head is not None and head.kind == "disaggregated":
        parts += ["<p>The answer, prefill/decode disaggregated (one line per node, then the router):</p>",
                  "<pre>" + _e("\n".join(head.launch)) + "</pre>",
                  "<p>The colocated runner-up:</p>"]
    if single:
        parts += ["<p>One node:</p>", f"<pre>{_e(single)}</pre>"]
    parts += ["<p>One instance over several nodes (run one line on each node):</p>",
              "<pre>" + _e("\n".join(multi)) + "</pre>", "<ul>" + "".join(f"<li>{_e(n)}</li>" for n in notes)
              + "</ul>", *_campaign_html(r), "<h2>How these numbers were made</h2>",
              "<ul>" + "".join(f"<li>{_e(m)}</li>" for m in _method(r)) + "</ul>"]
    return parts


MEASURE_TITLE = "Measure it: a campaign file for this question"
MEASURE_SAID = ("The recommended deployment against BF16 KV and the shipped weights (and yours, where it differs), "
                "under this workload and SLO, each a sweep to one instance's highest rate within the SLO: what the "
                "intervals above leave open, measured on your GPUs.")


def _campaign_html(r: Report) -> list[str]:
    """The plan's campaign file (bench/model/advice/campaign_file.py) as downloads that stand in the page."""
    from base64 import b64encode

    from bench.model import for_plan

    made = for_plan(r.plan)
    if made is None:
        return []
    files = [(made.file_name, made.text)] + ([(made.workload_name, made.workload_text or "")]
                                             if made.workload_name else [])
    links = " ".join(f"<a download='{_e(name)}' href='data:text/yaml;base64,{b64encode(text.encode()).decode()}'>"
                     f"{_e(name)}</a>" for name, text in files)
    return [f"<h2 id='campaign-file'>{MEASURE_TITLE}</h2>", f"<p>{_e(MEASURE_SAID)} Download: {links} (into one "
            f"folder), then <code>capbench campaign {_e(made.file_name)} --check</code> and "
            f"<code>capbench campaign {_e(made.file_name)}</code> on the GPU host.</p>"]


def _campaign_md(r: Report) -> list[str]:
    from bench.model import for_plan

    made = for_plan(r.plan)
    if made is None:
        return []
    out = [f"## {MEASURE_TITLE}", "", MEASURE_SAID, "", f"`{made.file_name}` (check it: `capbench campaign "
           f"{made.file_name} --check`):", "", "```yaml", made.text.rstrip(), "```", ""]
    if made.workload_name:
        out += [f"`{made.workload_name}`, beside it:", "", "```yaml", (made.workload_text or "").rstrip(), "```", ""]
    return out


def to_markdown(r: Report) -> str:
    q, plan = r.plan.question, r.plan
    t = tables(r)
    single, multi, notes = launch(r)
    when = datetime.fromtimestamp(r.generated_at, UTC).strftime("%Y-%m-%d %H:%M UTC")
    out = [f"# {_title(r)}", "",
           f"capbench {__version__}, {when}. Results DB: {r.db or 'none'}. (Charts: see the HTML report.)", "",
           "## The question", "", question_text(q), "", "## The answer", ""]
    out += [f"- {x}" for x in answer_lines(r)] + [""]
    for key, title in SECTIONS.items():
        if key in ("measured", "vs") and not r.measured:
            out += [f"## {title}", "", "Nothing was measured." + (" How to measure:" if key == "measured" else ""), ""]
            if key == "measured":
                out += ["```bash", *_howto(r), "```", ""]
            continue
        if key in t:
            out += [f"## {title}", "", _md_table(*t[key]), ""]
    out += [f"> {n}" for n in plan.notes]
    if r.drift is not None and not r.drift.empty:
        out += ["## Quality drift (capbench drift runs)", "", _md_table(*_drift_rows(r)), ""]
    out += ["## Launch commands (SGLang 0.5.23 with capbench's patches)", ""]
    if r.headline is not None and r.headline.kind == "disaggregated":
        out += ["The answer, prefill/decode disaggregated (one line per node, then the router):", "", "```bash",
                *r.headline.launch, "```", "", "The colocated runner-up:", ""]
    if single:
        out += ["One node:", "", "```bash", single, "```", ""]
    out += ["One instance over several nodes (one line on each node):", "", "```bash", *multi, "```", ""]
    out += [f"- {n}" for n in notes] + ["", *_campaign_md(r), "## How these numbers were made", ""]
    out += [f"- {m}" for m in _method(r)]
    return "\n".join(out) + "\n"


def render(r: Report | list[Report], fmt: str = "html") -> str:
    if isinstance(r, list):
        if fmt == "html":
            return to_html_many(r) if len(r) > 1 else to_html(r[0])
        return "\n".join(to_markdown(x) for x in r)
    if fmt == "html":
        return to_html(r)
    if fmt == "md":
        return to_markdown(r)
    raise BadInput(f"--format must be html or md, not {fmt!r}")


def write(r: Report | list[Report], out: str | Path, fmt: str = "html") -> Path:
    path = Path(out)
    text = render(r, fmt)
    if not path.parent.is_dir():
        raise BadInput(f"directory of --out does not exist: {path.parent}")
    with replacing(path) as tmp:
        tmp.write_text(text, encoding="utf-8")
    return path

