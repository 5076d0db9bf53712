"""The campaign commands: `campaign` (run a campaign file now, in this process) and `serve` (the dashboard and the
one runner process that runs queued campaigns)."""

from __future__ import annotations

import typer


def campaign(
    file: str = typer.Argument(None, help="Campaign YAML (schema: data/campaigns/README.md), or a built-in name."),
    db: str = typer.Option("data/capbench.duckdb", help="Results DB (runs and the campaign are added)."),
    resume: bool = typer.Option(False, "--resume", help="Continue the latest unfinished campaign of this file, "
                                "skipping its completed cells."),
    check: bool = typer.Option(False, "--check", help="Only check the file (one line per problem, exit 2)."),
    report: str = typer.Option(None, help="Also write the campaign report as HTML here."),
    templates: str = typer.Option(None, help="Launch templates the campaign may name (YAML: name -> {start, stop, "
                                  "host}); templates written in the campaign file itself are accepted here too."),
    stop_orphans: bool = typer.Option(False, "--stop-orphans", help="Only stop what campaigns whose runner is gone "
                                      "left running in --db: their templates' stop commands (remote servers), "
                                      "then their processes on this host."),
    details: bool = typer.Option(False, "--details", help="After the gains and each cell's rates: each cell's "
                                 "predicted $/1M, repeats, bracket, stages and where the SLO broke; what each gain's "
                                 "interval says."),
) -> None:
    """Run a benchmark matrix: deployments (SGLang launches, twins, URLs) x loads, sweeps to saturation; at the end
    the gains against each baseline, then each cell's highest rate within the SLO (--details: the rest)."""
    from pathlib import Path

    from bench.campaign import load_campaign, operator_templates, run_campaign
    from bench.errors import BadInput

    if stop_orphans:
        _stop_orphans(Path(db))
        return
    if file is None:
        raise BadInput("a campaign file is required (or --stop-orphans)")

    spec = load_campaign(file, operator_templates(templates))
    if check:
        from bench.campaign import check_fits

        check_fits(spec, file)
        print(f"{file}: {len(spec.deployments)} deployments x {len(spec.loads)} loads, no problem found")
        return
    try:
        cid = run_campaign(spec, Path(db), source=file, resume=resume)
    except KeyboardInterrupt:
        raise typer.Exit(130) from None
    if _report(cid, Path(db), report, details) != "completed":
        raise typer.Exit(1)  # some cell failed: the tables above say which and why


def _stop_orphans(db) -> None:  # noqa: ANN001
    from bench.campaign import stop_orphans

    n = stop_orphans(db, print)
    print(f"{db}: {n} leftover server(s) stopped" if n else f"{db}: nothing a campaign left is running")


def _report(cid: str, db, out: str | None, details: bool) -> str:
    """Prints the campaign's answer and tables (and writes its HTML); returns its status."""
    from bench import report as rep
    from bench.report import screen

    matrix = rep.campaign_matrix(db, cid)
    html = f"the HTML page: capbench report --campaign {cid} --db {db} --out FILE.html"
    screen.show(rep.campaign_answer(matrix) + ([] if details else [screen.more(rep.CAMPAIGN_MORE, html)]))
    screen.tables_console().print(rep.campaign_tables(matrix, details))
    if out:
        rep.write_campaign(matrix, out)
        print(f"campaign report: {out}")
    return matrix.status


def serve(
    db: str = typer.Option("data/capbench.duckdb", help="Results DB the runner writes and the dashboard reads."),
    port: int = typer.Option(8501, help="Dashboard port."),
    host: str = typer.Option("127.0.0.1", help="Dashboard address."),
    templates: str = typer.Option(None, help="The only launch templates queued campaigns may use, by name (YAML: "
                                  "name -> {start, stop, host}); without it, twins and URLs only."),
) -> None:
    """The dashboard and one runner process that owns the DB's writes and runs queued campaigns in turn; anyone who
    can open the page may queue, so a campaign launches SGLang only through the operator's --templates."""
    from pathlib import Path

    from bench.campaign import serve_queue

    code = serve_queue(Path(db), host, port, templates)
    if code:
        raise typer.Exit(code)
