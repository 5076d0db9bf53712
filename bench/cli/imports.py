"""`capbench import`: results made by other load generators (AIPerf, SGLang's bench_serving, guidellm) into the
results DB as runs with their provenance, for `runs`, Compare, `report` and `calibrate`."""

from __future__ import annotations

import typer

from bench.cli.runs import DB


def import_results(
    tool: str = typer.Argument(..., help="aiperf | bench-serving | guidellm: the tool that wrote FILE."),
    file: str = typer.Argument(..., help="AIPerf's profile_export.jsonl, bench_serving's --output-file JSONL "
                               "(with --output-details) or guidellm's benchmarks JSON; a file with only the tool's "
                               "summary (profile_export_aiperf.json alone, bench_serving without --output-details) "
                               "imports as a summary-only run."),
    deployment: str = typer.Option(..., help="What the measured server ran, as a deployment spec: "
                                   "MODEL@GPUxN[,kv=...,dp=...] (e.g. kimi-k2-thinking@h200x8,kv=fp8_e4m3)."),
    db: str = DB,
    label: str = typer.Option("", help="A label for the imported run(s)."),
) -> None:
    """Import another tool's results as runs (every request where the file has them, else the tool's summary
    figures); a file imported before is left as it is."""
    from bench.imports import import_file

    for run_id, stored in import_file(tool, file, deployment, db, label):
        print(f"{run_id}  imported from {tool}" if stored else
              f"{run_id}  already imported (same sha256): nothing done")
