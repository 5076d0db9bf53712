"""Results made by other load generators, into the store as runs with their provenance (`capbench import`).

common         the file read once (bench.files), its digest, one-line problems, provenance
aiperf         NVIDIA AIPerf's profile_export.jsonl (per request); profile_export_aiperf.json alone (summary)
bench_serving  SGLang's bench_serving --output-file JSONL (per-request lists, no wall clock; or the summary only)
guidellm       guidellm's benchmarks JSON (per request, one run per benchmark; or its metrics only)

A file with only the tool's summary becomes a summary-only run: its figures in run_summaries, no requests.
"""

from __future__ import annotations

from pathlib import Path

from bench.errors import BadInput
from bench.imports import aiperf, bench_serving, guidellm
from bench.imports.common import MAX_BYTES, deployment_spec, parse, read_bytes, store_runs

TOOLS = {m.NAME: m for m in (aiperf, bench_serving, guidellm)}


def import_file(tool: str, path: str | Path, deployment: str, db: str | Path,
                label: str = "") -> list[tuple[str, bool]]:
    """Every run in the tool's file into the store at `db`, all or none (one transaction); a run already imported
    (the same sha256) is left as it is. Returns (run id, stored now?) per run; BadInput (one line) on a bad file."""
    from bench.store import Store, write_imported_runs

    module = TOOLS.get(tool)
    if module is None:
        raise BadInput(f"unknown tool {tool!r}; capbench imports {', '.join(TOOLS)}")
    path = Path(path)
    spec = deployment_spec(deployment)
    data, sha = read_bytes(path, module.WHAT)
    source = str(path)
    doc = module.read(data, source) if hasattr(module, "read") else parse(data, source, module.WHAT)
    try:
        runs = module.runs(doc, source, sha, path, data)
    except BadInput:
        other = next((name for name, m in TOOLS.items() if m is not module and m.looks_like(doc)), None)
        if other and not module.looks_like(doc):
            raise BadInput(f"{source}: this looks like a {TOOLS[other].WHAT}, not a {module.WHAT}: use "
                           f"`capbench import {other}`") from None
        raise
    return write_imported_runs(Store(db), store_runs(tool, path.resolve(), sha, runs, spec, label))


__all__ = ["TOOLS", "MAX_BYTES", "import_file"]
