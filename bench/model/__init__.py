"""What we predict: pure arithmetic on data/ (no DB, no HTTP, no GPU), in layers that import only downwards:

fits      what fits: catalog, backend (the attention backend SGLang runs), capacity (SGLang's memory arithmetic), spec,
          formats (routed-expert weight formats: bytes, kernels per GPU arch, checkpoints, accuracy)
step      what a step costs: perfmodel, kernels + kernel_step (measured kernel tables), calibration, interconnect
serving   how a server schedules and queues: workload, scheduler, queues, slo, simulate, rate (the one rate search)
evidence  what the evidence says: corpus, validate, fit, interval, confidence, bootstrap, paired
advice    what to buy: option, plan, curve, launch, format_table (`capbench formats`), fp8_kv (FP8 KV's pool gain
          and step cost per backend)
pd        prefill/decode disaggregation: disagg, search, simulate, interval, versus, launch, validate
answer    what we answer: the headline (the CLI's first screen, the Planner's top, a report's first section)

Callers outside bench.model import from here or from a layer's package, by the names their __all__ lists.
"""

from bench.model import answer, pd
from bench.model.advice import (
    HOURS_PER_MONTH,
    CampaignFile,
    Config,
    Option,
    Plan,
    Question,
    campaign_file,
    curve,
    for_plan,
    format_table,
    fp8_kv,
    launch,
    make_plan,
    option,
    plan,
    prices,
    workload_names,
)
from bench.model.evidence import (
    Interval,
    Paired,
    StageSample,
    Verdict,
    behind_said,
    bootstrap,
    cell_gain,
    confidence,
    corpus,
    drop_gate,
    fit,
    gain_interval,
    gain_words,
    interval,
    mean_interval,
    paired,
    paired_difference,
    stage_sample,
    validate,
)
from bench.model.fits import Capacity, Deployment, Spec, backend, capacity, catalog, formats, parse_spec, spec
from bench.model.serving import (
    Point,
    Prediction,
    Request,
    Scheduler,
    Slo,
    Sweep,
    Workload,
    fixed_workload,
    load_workload,
    parse_slo,
    queues,
    rate,
    scheduler,
    search_rate,
    simulate,
    slo,
    within_slo,
    workload,
)
from bench.model.step import (
    Efficiency,
    PerfModel,
    calibration,
    interconnect,
    kernels,
    load_efficiency,
    perfmodel,
    usd_per_million,
)

__all__ = [
    "answer", "pd", "format_table", "formats", "backend", "calibration", "capacity", "catalog", "corpus", "curve",
    "fit", "interval", "launch",
    "option",
    "perfmodel", "plan", "rate", "scheduler", "simulate", "slo", "spec", "validate", "workload", "interconnect",
    "queues", "confidence", "bootstrap", "paired", "kernels", "fp8_kv", "campaign_file", "CampaignFile", "for_plan",
    "prices",
    "Efficiency", "load_efficiency", "Capacity", "Deployment", "HOURS_PER_MONTH", "Config", "Option", "PerfModel",
    "Plan", "Question", "make_plan", "workload_names", "Prediction", "search_rate", "within_slo", "Request",
    "Scheduler", "Point", "Sweep", "Slo", "parse_slo", "Spec", "parse_spec", "Workload", "fixed_workload",
    "load_workload", "usd_per_million", "Interval", "behind_said", "gain_interval", "gain_words", "mean_interval",
    "StageSample", "cell_gain", "stage_sample", "Paired", "Verdict", "drop_gate", "paired_difference",
]
