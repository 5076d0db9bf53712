"""The `capbench` command: one typer app, one thin function per command, grouped by area in this package
(plan: capacity, simulate, plan; validate; formats; runs: run, worker, runs, export, calibrate; imports: import;
twin: twin, demo; report: report, dashboard, drift, eval; campaign: campaign, serve; patches: sglang-launch,
calibrate-kv-scales, quantize-int4, quantize-experts; gpu: gpu-check, gpu-check-merge). Bad input ends in one line
on stderr and exit code 2, numbers and paths checked first (checks.py)."""

from __future__ import annotations

import sys

import typer

from bench.cli import campaign, formats, gpu, imports, patches, plan, report, runs, twin, validate
from bench.cli.checks import checked
from bench.errors import BadInput

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="Capacity planning for MoE models on SGLang.")


@app.callback()
def _root() -> None:
    """capbench: how many GPUs a large MoE model needs on SGLang, and what FP8 KV and INT4 experts buy."""


for command in (plan.capacity, plan.simulate, validate.validate, plan.plan, formats.formats, runs.run, runs.worker,
                runs.runs, runs.export, runs.calibrate, twin.twin, twin.demo, report.report, report.dashboard,
                report.drift, report.eval, patches.calibrate_kv_scales, patches.quantize_int4, patches.quantize_experts,
                campaign.campaign, campaign.serve, gpu.gpu_check, gpu.gpu_check_merge):
    app.command()(checked(command))
app.command("import")(checked(imports.import_results))
app.command("sglang-launch", context_settings={"allow_extra_args": True, "ignore_unknown_options": True})(
    checked(patches.sglang_launch))


def main() -> None:
    # Locust's gevent wants to patch before the rest
    if len(sys.argv) > 1 and sys.argv[1] in ("run", "worker", "demo", "campaign", "serve"):
        from gevent import monkey

        monkey.patch_all()
    try:
        app(standalone_mode=True)
    except BadInput as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
