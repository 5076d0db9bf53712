"""What a person reads: `report` (a self-contained capacity report), `dashboard` (the Streamlit app), `drift`
(quality drift between two servers) and `eval` (task suites scored by checkers, A/B with a gate)."""

from __future__ import annotations

import sys

import typer

from bench.errors import BadInput


def report(
    out: str = typer.Option(..., help="File to write (FILE.html or FILE.md)."),
    fmt: str = typer.Option("html", "--format", help="html (self-contained, inline SVG charts) | md"),
    db: str = typer.Option("data/capbench.duckdb", help="Results DB (read-only); none: a planning report."),
    runs: str = typer.Option(None, help="Comma-separated run ids (default: the newest runs of the model and GPU)."),
    model: str = typer.Option(None, help="Model id (default: the newest run's, else kimi-k2-thinking)."),
    gpu: str = typer.Option(None, help="GPU id (default: the newest run's, else h200)."),
    tp: int = typer.Option(None, help="GPUs per instance (default: the newest run's, else 8)."),
    kv_dtype: str = typer.Option(None, help="Your KV dtype choice (default: the newest run's, else fp8_e4m3)."),
    weights: str = typer.Option(None, help="Your expert weights choice (default: the newest run's, else native)."),
    context: int = typer.Option(None, help="Context length (default: the model's maximum)."),
    workload: str = typer.Option("chat", help="Request mix for the predictions: chat | long-context | "
                                 "agentic-coding | a workload YAML path."),
    input_len: int = typer.Option(None, help="Fixed prompt tokens instead of --workload (with --output-len)."),
    output_len: int = typer.Option(None, help="Fixed output tokens instead of --workload."),
    target_rate: float = typer.Option(10.0, help="Load to plan for, requests per second."),
    slo: str = typer.Option("ttft=2s,tpot=50ms,p=90", help="SLO: ttft=2s,tpot=50ms[,e2e=30s][,p=50|90|99]; a rate "
                            "meets it when those percentiles do."),
    price: str = typer.Option(None, help="$ per GPU-hour: one figure for --gpu (3.10), or one per GPU "
                              "(h200=3.10,b200=5.20); the others at the catalog's indicative prices, "
                              "as the report says."),
    gpus: str = typer.Option(None, help="Comma-separated GPU ids to search (default: every GPU in the catalog)."),
    campaign: str = typer.Option(None, help="Instead: the campaign report (HTML) of this campaign id in --db, or "
                                 "'latest' (what the Campaigns page of `capbench serve` offers for download)."),
) -> None:
    """A self-contained capacity report: question, configurations, capacity, measured vs predicted,
    recommendation with monthly cost and savings, SGLang launch commands."""
    import os
    from pathlib import Path

    from rich.progress import Progress

    from bench import report as rep
    from bench.cli.prices import parse_price
    from bench.model import Question, parse_slo

    if campaign:
        _campaign_report(campaign, db, out, fmt)
        return
    if (input_len is None) != (output_len is None):
        raise BadInput("give both --input-len and --output-len, or neither")
    run_ids = [r.strip() for r in runs.split(",") if r.strip()] if runs else None
    dep = rep.newest_deployment(db, run_ids) if not (model and gpu and tp) else {}
    s = parse_slo(slo)
    q = Question(model=model or dep.get("model", "kimi-k2-thinking"), gpu=gpu or dep.get("gpu", "h200"),
                 tp=int(tp or dep.get("tp", 8)), kv_dtype=kv_dtype or dep.get("kv_dtype", "fp8_e4m3"),
                 weights=weights or dep.get("weights", "native"), context=context,
                 workload=None if input_len else workload, input_tokens=input_len or 2000,
                 output_tokens=output_len or 500, slo=s, target_rate_rps=target_rate,
                 search_gpus=tuple(g.strip() for g in gpus.split(",") if g.strip()) if gpus else None,
                 **parse_price(price, gpu or dep.get("gpu", "h200")))
    if fmt not in ("html", "md"):
        raise BadInput(f"--format must be html or md, not {fmt!r}")
    if not Path(out).expanduser().resolve().parent.is_dir():
        raise BadInput(f"directory of --out does not exist: {Path(out).parent}")
    with Progress(transient=True) as bar:
        task = bar.add_task("simulating configurations and reading runs", total=None)
        r = rep.build(q, db, run_ids, progress=lambda: bar.advance(task), workers=os.cpu_count() or 1)
    path = rep.write(r, out, fmt)
    print(f"wrote {path} ({'measured: ' + str(len(r.runs)) + ' run(s)' if r.measured else 'nothing measured'})")


def _campaign_report(campaign: str, db: str, out: str, fmt: str) -> None:
    from pathlib import Path

    from bench import report as rep

    if fmt != "html":
        raise BadInput("a campaign report is HTML only (--format html)")
    if not Path(db).is_file():
        raise BadInput(f"--db {db}: no such results DB")
    cid = rep.latest_campaign(db) if campaign == "latest" else campaign
    if cid is None:
        raise BadInput(f"no campaign in {db}")
    path = rep.write_campaign(rep.campaign_matrix(db, cid), out)
    print(f"wrote {path} (campaign {cid})")


def dashboard(
    db: str = typer.Option("data/capbench.duckdb", help="Results DB to show (opened read-only)."),
    port: int = typer.Option(8501, help="Port on 127.0.0.1."),
    host: str = typer.Option("127.0.0.1", help="Address to bind (default: this machine only)."),
) -> None:
    """Start the Streamlit dashboard: Planner, Runs, Compare, Integrity."""
    import os
    from pathlib import Path

    if not 1 <= port <= 65535:
        raise BadInput(f"--port must be between 1 and 65535, got {port}")
    app_py = Path(__file__).resolve().parents[2] / "dashboard" / "app.py"
    env = {**os.environ, "CAPBENCH_DB": str(Path(db).expanduser().resolve())}
    argv = [sys.executable, "-m", "streamlit", "run", str(app_py), "--server.address", host, "--server.port",
            str(port), "--server.headless", "true", "--browser.gatherUsageStats", "false"]
    print(f"capbench dashboard on http://{host}:{port} (DB {env['CAPBENCH_DB']})", flush=True)
    os.execvpe(argv[0], argv, env)


def drift(
    target: list[str] = typer.Option(..., help="Two servers, A then B: URLs or twin:SPEC (e.g. twin:glm-4.6@h200x8)."),
    prompts: list[str] = typer.Option(None, help="JSONL prompt files (default: data/prompts/drift.jsonl)."),
    db: str = typer.Option("data/capbench.duckdb", help="Results DB."),
    label: str = typer.Option("", help="A label for the run."),
    model: str = typer.Option(None, help="Model name to send (default: each server's /v1/models)."),
    api_key_env: str = typer.Option(None, help="Environment variable holding the API key."),
    concurrency: int = typer.Option(8, help="Prompts in flight at once."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of a table."),
    max_mean_kl: float = typer.Option(None, help="Gate: fail (exit 1) if any kind's mean KL exceeds this."),
    min_token_agreement: float = typer.Option(None, help="Gate: fail if any kind's token agreement is below this."),
    min_exact_match: float = typer.Option(None, help="Gate: fail if any kind's exact-match share is below this."),
) -> None:
    """Quality drift: the same prompts sent greedily with top logprobs to two servers, compared token by token.
    With a threshold, a rollout gate: exit 1 when any prompt kind misses it (or any prompt fails)."""
    from pathlib import Path

    from bench.drift import Gate, drift_command

    _, failures = drift_command(target, [Path(p) for p in prompts or []], Path(db), label, model, api_key_env,
                                concurrency, as_json, Gate(max_mean_kl, min_token_agreement, min_exact_match))
    if failures:
        raise typer.Exit(1)


def eval(  # noqa: A001 (the command's name)
    target: list[str] = typer.Option(..., help="One server, or two (A then B) to compare on the same problems: URLs "
                                     "or twin:SPEC (a twin's answers are synthetic text, not a model's)."),
    suite: str = typer.Option("humaneval", help="Comma-separated: humaneval, bfcl-simple, bfcl-multiple, "
                              "bfcl-parallel, bfcl-multi-turn, retrieval, long (two targets); bfcl = its four; all."),
    limit: int = typer.Option(None, help="Problems per suite, drawn with --seed (default: all)."),
    seed: int = typer.Option(0, help="Seed of the problems drawn and of every request."),
    db: str = typer.Option("data/capbench.duckdb", help="Results DB (the run and every answer)."),
    label: str = typer.Option("", help="A label for the run."),
    model: str = typer.Option(None, help="Model name to send (default: each server's /v1/models)."),
    api_key_env: str = typer.Option(None, help="Environment variable holding the API key."),
    concurrency: int = typer.Option(4, help="Problems in flight at once."),
    timeout: float = typer.Option(600.0, help="Seconds one request may take; past it, an endpoint error."),
    max_drop: float = typer.Option(2.0, help="Gate (two targets): fail (exit 1) when B's pass rate is surely more "
                                   "than this many points below A's."),
    change: str = typer.Option("", help="What B changes against A, for the per-change report "
                               "(e.g. 'FP8 KV, scale 1.0')."),
    ignore_eos: bool = typer.Option(False, help="long: generate to 16k tokens whatever the model's end token."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of tables."),
) -> None:
    """Task suites scored by checkers: HumanEval run in a sandbox, BFCL v4 tool calls, long generations and
    long-context retrieval. With two targets, B against A on the same problems with a 90 % interval and a gate."""
    from pathlib import Path

    from bench.eval import Options, eval_command

    _, passed = eval_command(Options(target, suite, limit, seed, Path(db), label, model, api_key_env, concurrency,
                                     timeout, max_drop, change, ignore_eos, as_json))
    if not passed:
        raise typer.Exit(1)
