"""`capbench eval`: start twin targets if asked, run the suites, store one run with every answer, print per suite the
pass rate with its interval and, with two targets, the paired difference B - A and the gate's verdict."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from bench.checks import check_target
from bench.errors import BadInput
from bench.eval import run, suites
from bench.eval.client import Endpoint


@dataclass
class Options:
    targets: list[str]
    suites: str = "humaneval"
    limit: int | None = None
    seed: int = 0
    db: Path = Path("data/capbench.duckdb")
    label: str = ""
    model: str | None = None
    api_key_env: str | None = None
    concurrency: int = 4
    timeout_s: float = 600.0
    max_drop: float = 2.0
    change: str = ""  # what B changes against A, for the per-change report (e.g. "FP8 KV, scale 1.0")
    ignore_eos: bool = False
    as_json: bool = False


def is_twin(spec: str, url: str) -> bool:
    """A capbench twin (its /get_server_info says so), started here or at a URL."""
    if spec.startswith("twin:"):
        return True
    import httpx

    from bench import http

    try:
        return "capbench" in http.get(url + "/get_server_info", timeout=5).json()
    except (httpx.HTTPError, ValueError, TypeError):
        return False


def check(o: Options) -> list[str]:
    if len(o.targets) not in (1, 2):
        raise BadInput("capbench eval takes one --target, or two (A then B) for an A/B comparison")
    for spec in o.targets:
        if not spec.startswith("twin:"):
            check_target(spec)
    for name, value, low in (("--concurrency", o.concurrency, 1), ("--timeout", o.timeout_s, 1)):
        if not value >= low:
            raise BadInput(f"{name} must be >= {low}, not {value}")
    if o.limit is not None and o.limit < 1:
        raise BadInput(f"--limit must be >= 1, not {o.limit}")
    if not 0 <= o.max_drop <= 100:
        raise BadInput(f"--max-drop is in points, 0 to 100, not {o.max_drop}")
    return suites.parse(o.suites)


def eval_command(o: Options) -> tuple[str, bool]:
    """Returns the run id and whether every gate passed (True with one target: there is no gate)."""
    from rich.progress import Progress

    from bench.drift import family_of
    from bench.runner import discover_model
    from bench.store import Store
    from bench.twin import Target

    names = check(o)
    store = Store(o.db)
    opened: list[Target] = []
    try:
        opened = [Target(spec) for spec in o.targets]
        eps = [Endpoint(t.url, o.model or discover_model(t.url, o.api_key_env), o.timeout_s, o.api_key_env)
               for t in opened]
        twin = any(is_twin(spec, t.url) for spec, t in zip(o.targets, opened, strict=True))
        config = {"kind": "eval", "targets": o.targets, "models": [e.model for e in eps],
                  "family": family_of(eps[0].model), "change": o.change, "seed": o.seed, "limit": o.limit,
                  "max_drop": o.max_drop, "twin": twin, "suites": {s: suites.data_info(s) for s in names}}
        run_id = store.start_run(label=o.label or "eval", target=" vs ".join(o.targets), profile="eval",
                                 config=config)
        try:
            totals = {s: len(suites.problems(s, o.limit, o.seed)[0]) for s in names}
            with Progress(transient=True, disable=o.as_json) as bar:
                tasks = {s: bar.add_task(suites.NAMES[s], total=n) for s, n in totals.items()}
                results = []
                for s in names:  # one suite at a time, its own bar
                    results += run.evaluate(eps, [s], o.limit, o.seed, o.concurrency,
                                            lambda s=s: bar.advance(tasks[s]), o.ignore_eos)
            store.add_rows("eval_answers", run.answer_rows(run_id, o.targets, results))
            store.add_rows("eval_positions", run.position_rows(run_id, results))
        except BaseException:
            store.finish_run(run_id, "aborted")
            raise
        answers = [a for r in results for side in r.answers for a in side]
        if (answers and all(a.outcome == "error" for a in answers)) or (not answers and all(
                r.long_errors == r.problems for r in results)):
            store.finish_run(run_id, "failed")
            raise BadInput("every problem failed at the endpoint (first: "
                           f"{answers[0].detail if answers else 'no answer'}); is each --target serving?")
        store.finish_run(run_id, "completed")
    finally:
        for t in opened:
            t.close()
    said = run.summary(results, o.max_drop)
    passed = all(s.get("gate", {}).get("status", "passed") != "failed" for s in said)
    if o.as_json:
        print(json.dumps({"run_id": run_id, "family": config["family"], "twin": twin,
                          "twin_note": run.TWIN_NOTE if twin else None, "suites": said}, indent=2, default=str))
    else:
        show(run_id, o.targets, said, twin)
    return run_id, passed


def show(run_id: str, targets: list[str], said: list[dict], twin: bool) -> None:
    from rich.console import Console
    from rich.table import Table

    from bench.report import quality

    console = Console(width=max(Console().width, 120))
    t = Table(title=f"eval (run {run_id}): {' vs '.join(targets)}")
    for col in ("suite", "problems", *(f"{x} pass rate [90 %]" for x in "AB"[:len(targets)]), "errors",
                "unparsed", "B - A [90 %]", "gate"):
        t.add_column(col, justify="left" if col in ("suite", "gate") else "right")
    for s in said:
        if s["suite"] == "long":
            continue
        sides = s["sides"]
        t.add_row(s["name"], str(s["problems"]), *(quality.rate_said(x) for x in sides),
                  " / ".join(str(x["errors"] + x["not_run"]) for x in sides),
                  " / ".join("-" if x["unparsed"] is None or not s["suite"].startswith("bfcl") else
                             f"{x['unparsed']:.1%}" for x in sides),
                  s["paired"]["said"] if "paired" in s else "-", s["gate"]["words"] if "gate" in s else "-")
    console.print(t)
    for s in said:
        if s["suite"] == "long":
            p = Table(title=f"long generations: A vs B by answer position ({s['errors']} prompts errored)")
            for col in ("answer tokens", "positions", "token agreement", "mean KL (nats)", "answers parting here"):
                p.add_column(col, justify="right")
            for row in s["positions"]:
                p.add_row(row["bin"], str(row["positions"]), "-" if row["token_agreement"] is None else
                          f"{row['token_agreement']:.1%}", "-" if row["mean_kl"] is None else f"{row['mean_kl']:.4f}",
                          str(row["first_divergences"]))
            console.print(p)
    console.print("errors: the endpoint's (timeouts, HTTP errors, malformed replies) and programs the sandbox could "
                  "not contain; never scored as the model's failures")
    if twin:
        console.print(f"[bold]Note:[/bold] {run.TWIN_NOTE}")
