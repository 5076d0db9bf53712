"""What a person reads: the capacity report, the charts the dashboard shares, measured vs predicted, CLI tables.

content    the report's content: the question, the plan, measured runs, savings, launch commands
render     the report as one self-contained HTML page (inline SVG, no script) or Markdown
charts     Altair charts of runs, shared with the dashboard
plancharts latency against load, the plan's Pareto views and the GPU comparison
load       latency against load, predicted and measured
wording    what the report and the Planner say: savings with their risk, why it does not fit, plain figures
predicted  a measured run beside the performance model's replay of it
terminal   rich tables for the CLI
screen     the CLI's first screen (the answer in ~15 lines of 100 columns) and its tables' style (120 columns)
simulated  what `capbench simulate` prints: the figures at a rate or each KV dtype's highest rate within the SLO
campaign   a campaign's matrix: highest rate within the SLO per cell, gains against the baseline
campaign_screen  what `capbench campaign` prints: the gains first, then the cells within 120 columns
curves     a campaign's latency against load: measured stages beside the model's curve, the SLO drawn
quality    pass rates with intervals, A/B per model family and per change, quality beside a campaign's gains
run_extras each GPU's utilisation and memory in the runs, and repeat groups' figures with their 90 % intervals
"""

import importlib

# a name, by the module that holds it: each is imported when first asked for, so a command that prints a table or
# a plan does not load Altair, pandas' charts and the report's renderer (~0.2 s of CPU a process)
_MODULES = ("charts", "formats_table", "load", "pd", "plancharts", "quality", "screen", "simulated", "terminal",
            "wording")
_NAMES = {
    "PREDICTED_GAIN": "campaign", "Matrix": "campaign", "campaign_html": "campaign", "campaign_list": "campaign",
    "campaign_matrix": "campaign", "campaign_sections": "campaign", "gain_said": "campaign",
    "latest_campaign": "campaign", "live_cell": "campaign", "run_stage": "campaign", "write_campaign": "campaign",
    "CAMPAIGN_MORE": "campaign_screen.MORE", "campaign_answer": "campaign_screen", "campaign_tables": "campaign_screen",
    "gain_line": "campaign_screen", "Report": "content", "build": "content", "compared": "content",
    "formats_section": "content", "gpu_bests": "content", "newest_deployment": "content",
    "predicted_table": "content", "campaign_curves": "curves", "STEADY_REQUESTS": "predicted",
    "measured_vs_predicted": "predicted", "render": "render", "write": "render",
}


def __getattr__(name: str):
    if name in _MODULES:
        return importlib.import_module(f"{__name__}.{name}")
    if name not in _NAMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    module, _, attr = _NAMES[name].partition(".")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), attr or name)
    globals()[name] = value
    return value


__all__ = ["charts", "formats_table", "load", "plancharts", "screen", "simulated", "terminal", "wording", "Report",
           "build", "compared",
           "formats_section", "gpu_bests",
           "newest_deployment", "predicted_table", "STEADY_REQUESTS", "measured_vs_predicted", "render", "write",
           "Matrix", "campaign_html", "campaign_matrix", "campaign_sections", "campaign_tables", "latest_campaign",
           "write_campaign", "campaign_list", "live_cell", "pd", "gain_said", "campaign_curves", "run_stage",
           "PREDICTED_GAIN", "quality", "campaign_answer", "gain_line", "CAMPAIGN_MORE"]
