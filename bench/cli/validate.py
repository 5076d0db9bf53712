"""`capbench validate`: the published SGLang measurements replayed through the model, the verdict against the
goals first (bench/report/screen.py's first screen), the cases under --details."""

from __future__ import annotations

import json

import typer

from bench.errors import BadInput


def validate(
    fit: bool = typer.Option(False, "--fit", help="Fit the model's factors to the corpus first (writes "
                             "data/calibration/corpus.json and validation.json, with leave-one-source-out error)."),
    case: str = typer.Option(None, help="Only the cases whose 'source/case' id contains this text."),
    rounds: int = typer.Option(12, help="Trial steps of the fit's least squares (with --fit)."),
    rescore: bool = typer.Option(False, "--rescore", help="Replay validation.json's cases with today's model and "
                                 "the last fit's factors, without fitting again (after a change that adds no "
                                 "fitted factor)."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of tables."),
    details: bool = typer.Option(False, "--details", help="After the verdict and the error summary: every case "
                                 "published vs predicted, the GPU rankings, the intervals' coverage per regime, the "
                                 "disaggregated cases."),
) -> None:
    """Replay every published SGLang measurement (data/measurements) through the scheduler and performance model,
    the way its benchmark ran it: the verdict against the goals and the error summary (--details: every case)."""
    from rich.progress import Progress

    from bench.model import corpus, interval, load_efficiency
    from bench.model import fit as fitting
    from bench.model import validate as val
    from bench.report import screen, terminal

    matching = [c for c in corpus.load() if not case or case in c.key]
    if not matching:
        raise BadInput(f"no published case matches {case!r}")
    cases = [c for c in matching if c.kind != "disaggregated"]  # replayed apart, by validate_pd
    goal = [c for c in cases if fitting.in_goal(c) is None]
    with Progress(transient=True, disable=as_json) as bar:
        if fit:
            if case:
                raise BadInput("--fit fits the whole corpus; leave out --case")
            task = bar.add_task("fitting on every source", total=None)
            say = lambda msg: bar.update(task, description=msg)  # noqa: E731
            replayer = fitting.Replayer()
            try:
                last, last_by_org = fitting.last_scales({c.source.org for c in goal})
                scale, _ = fitting.fit(goal, replayer, say, rounds, base=last)
                out_of_sample, by_org = fitting.leave_one_source_out(goal, replayer, say, rounds,
                                                                     base_by_org=last_by_org)
                in_sample = replayer(goal, scale)
                excluded = replayer([c for c in cases if fitting.in_goal(c) is not None], scale)
            finally:
                replayer.close()
            fitting.write(scale, in_sample, out_of_sample, by_org, excluded)
        elif rescore:
            if case:
                raise BadInput("--rescore replays the whole corpus; leave out --case")
            bar.add_task("replaying every case with the last fit's factors", total=None)
            replayer = fitting.Replayer()
            try:
                fitting.rescore(goal, [c for c in cases if fitting.in_goal(c) is not None], replayer)
            finally:
                replayer.close()
        task = bar.add_task("replaying the published cases", total=len(cases))
        replays = []
        for c in cases:
            replays.append(val.remembered(c, load_efficiency(c.gpu, fitted=False)))
            bar.advance(task)
    validation = fitting.stored_validation()
    report = val.report(replays, goal, validation)
    report["interval_coverage"] = interval.coverage()
    report["bias_by_publisher"] = [] if case else fitting.out_of_sample_bias(("org",))
    pd_replays = _pd_replays(matching)
    if as_json:
        print(json.dumps(report | {"disaggregated": [_pd_json(r) for r in pd_replays]}, indent=1, default=str))
        return
    screen.show(terminal.validation_answer(report, len(replays), len(goal), len(pd_replays))
                + ([] if details else [screen.more("every case published vs predicted, the GPU rankings, the "
                                                   "intervals' coverage per regime, the disaggregated cases")]))
    console = screen.tables_console()
    console.print(terminal.error_summary_table(report["summaries"], "Error summary (|predicted / published - 1|, "
                                               "cases in brackets)"))
    if not details:
        return
    why = {c.key: fitting.in_goal(c) or "" for c in cases}
    if replays:
        console.print(terminal.validation_table(replays, "Published SGLang measurements: published vs predicted", why))
    for row in report["gpu_ranking"]:
        console.print(f"GPUs ranked for {row['config']}: published {' > '.join(row['published_order'])}; predicted "
                      f"{' > '.join(row['predicted_order'])}{'' if row['agrees'] else '  (DISAGREES)'}")
    console.print(terminal.coverage_table(report["interval_coverage"]))
    if pd_replays:
        _print_pd_replays(console, pd_replays)


def _pd_replays(cases) -> list:
    from bench.model.pd import validate as validate_pd

    return validate_pd.replay_all(cases)


def _pd_json(r) -> dict:
    return {"case": r.case.key, "phase": r.case.pd.get("phase"), "gpu": r.case.gpu, "gpus": r.case.gpus,
            "model": r.case.model, "predicted": r.predicted, "errors": r.errors, "why_not": r.why_not,
            "uncertain": list(r.case.uncertain)}


def _print_pd_replays(console, replays) -> None:
    from bench.report import pd as pd_report

    console.print(pd_report.validation_table(replays))
    console.print("These prefill/decode-disaggregated, wide-EP cases are few (two posts, neither states its SGLang "
                  "version) and not in the goal above: the disaggregated plan rests on little evidence.")
