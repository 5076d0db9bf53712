"""What a person reads: the capacity report, the charts the dashboard shares, measured vs predicted, CLI tables.

content    the report's content: the question, the plan, measured runs, savings, launch commands
render     the report as one self-contained HTML page (inline SVG, no script) or Markdown
charts     Altair charts, shared with the dashboard
predicted  a measured run beside the performance model's replay of it
terminal   rich tables for the CLI
campaign   a campaign's matrix: highest rate within the SLO per cell, gains against the baseline
"""

from bench.report import charts, terminal
from bench.report.campaign import (
    Matrix,
    campaign_html,
    campaign_list,
    campaign_matrix,
    campaign_sections,
    campaign_tables,
    latest_campaign,
    live_cell,
    write_campaign,
)
from bench.report.content import Report, build, compared, newest_deployment
from bench.report.predicted import STEADY_REQUESTS, measured_vs_predicted
from bench.report.render import render, write

__all__ = ["charts", "terminal", "Report", "build", "compared", "newest_deployment", "STEADY_REQUESTS",
           "measured_vs_predicted", "render", "write", "Matrix", "campaign_html", "campaign_matrix",
           "campaign_sections", "campaign_tables", "latest_campaign", "write_campaign", "campaign_list", "live_cell"]
