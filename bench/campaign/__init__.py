"""Campaigns: the benchmark matrix (deployments x loads, with an SLO) run end to end on SGLang, twins or URLs.

spec    the campaign file: schema and every problem found before anything launches
guard   what a campaign file may hold: YAML limits, ranges, URLs, template placeholders, workload files, launch
        values (one word without shell characters)
flags   SGLang flags parsed by SGLang 0.5.23's option table: owned fields, secrets only as env:NAME
templates  launch templates: the operator's by name on `capbench serve`, the user's own on the command line
keys    the measurement keys of the file: stop_grace, repeats, workload paths relative to the file
predict what the model says: whether each deployment fits (before launch), its answer to a cell's sweep;
        check_campaign, the whole `--check` (also the Campaigns page's and serve's runner's)
launch  a deployment up and down: twin, URL, `capbench sglang-launch`, or that through the user's template
pd_spec    a disaggregated deployment in the file: prefill, decode and router roles placed on named nodes
pd_launch  it up and down: prefill and decode instances, then the router; stopped router, decode, prefill
pd_check   its capacity per role and the decode KV pool (before launch), its shape for the PD simulator
own     one runner per campaign (a lock), the launched servers recorded, identified, and stopped (leftovers too)
watchdog   nothing launched here outlives the campaign: marked processes ended when the runner ends, however
stage   one sweep stage judged: every request sent counts, the cut-off ones as misses
run     the loop: cells, sweeps to saturation, failures recorded with the log, resume
record  the campaign, its queue status and its cells in the results DB
queue   `capbench serve`'s runner: the one process that writes, running queued campaigns in turn
"""

from bench.campaign.launch import Launched, LaunchFailed, launch_command
from bench.campaign.own import stop_orphans
from bench.campaign.predict import check_campaign, check_fits
from bench.campaign.queue import pending, queue_dir, run_queue, serve_queue, submit
from bench.campaign.record import completed_cells, new_campaign
from bench.campaign.run import run_campaign
from bench.campaign.spec import Campaign, DeploymentSpec, Load, cell_key, load_campaign, parse_campaign
from bench.campaign.stage import stage_counts
from bench.campaign.templates import Template, operator_templates
from bench.kv_scales import check_scales

__all__ = [
    "LaunchFailed", "Launched", "launch_command", "completed_cells", "new_campaign", "run_campaign", "Campaign",
    "DeploymentSpec", "Load", "cell_key", "load_campaign", "parse_campaign", "pending", "queue_dir", "run_queue",
    "serve_queue", "submit", "Template", "operator_templates", "check_fits", "check_campaign",
    "check_scales", "stage_counts", "stop_orphans",
]
