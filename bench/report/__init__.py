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

from bench.report import charts, formats_table, load, pd, plancharts, quality, screen, simulated, terminal, wording
from bench.report.campaign import (
    PREDICTED_GAIN,
    Matrix,
    campaign_html,
    campaign_list,
    campaign_matrix,
    campaign_sections,
    gain_said,
    latest_campaign,
    live_cell,
    run_stage,
    write_campaign,
)
from bench.report.campaign_screen import MORE as CAMPAIGN_MORE
from bench.report.campaign_screen import campaign_answer, campaign_tables, gain_line
from bench.report.content import (
    Report,
    build,
    compared,
    formats_section,
    gpu_bests,
    newest_deployment,
    predicted_table,
)
from bench.report.curves import campaign_curves
from bench.report.predicted import STEADY_REQUESTS, measured_vs_predicted
from bench.report.render import render, write

__all__ = ["charts", "formats_table", "load", "plancharts", "screen", "simulated", "terminal", "wording", "Report",
           "build", "compared",
           "formats_section", "gpu_bests",
           "newest_deployment", "predicted_table", "STEADY_REQUESTS", "measured_vs_predicted", "render", "write",
           "Matrix", "campaign_html", "campaign_matrix", "campaign_sections", "campaign_tables", "latest_campaign",
           "write_campaign", "campaign_list", "live_cell", "pd", "gain_said", "campaign_curves", "run_stage",
           "PREDICTED_GAIN", "quality", "campaign_answer", "gain_line", "CAMPAIGN_MORE"]
