"""What we predict: pure arithmetic on data/ (no DB, no HTTP, no GPU).

catalog    model and GPU facts from data/ (+ the user's override file)
backend    SGLang 0.5.23's attention backends: its default, the ones that keep FP8 KV scales, the one a line names
capacity   SGLang 0.5.23's memory arithmetic: weights per GPU, KV pool tokens, sequences that fit
formats    routed-expert weight formats (data/expert_formats.yaml): bytes, kernels per GPU arch, checkpoints, accuracy
format_table  the formats side by side for one model on one GPU (`capbench formats`), priced by one call
perfmodel  step times of one instance (roofline terms with calibrated efficiencies), and cost
scheduler  continuous batching on the KV budget, as SGLang's scheduler does it (the twin runs it too)
workload   request mixes as the simulator draws them
slo        the SLO: a per-request bound (goodput) and a percentile bound (the highest rate within it)
simulate   the scheduler in virtual time: one rate, or a sweep to the highest rate within the SLO
rate       the highest rate one instance serves within the SLO, simulated until it converges
option     one deployment option: its capacity, its rate within the SLO, its cost
plan       the search over GPUs, tp, DP attention, EP, KV dtype and expert weights: the recommendation
corpus     published SGLang measurements (data/measurements)
validate   the corpus replayed through the model: predicted vs published
fit        the model's factors fitted to the corpus, with leave-one-source-out error
curve      a configuration's throughput per GPU against tokens/s per user over concurrency
interval   80 % intervals on every predicted figure from the corpus's out-of-sample errors, per regime
calibration the factors and where they come from (data/calibration)
spec       a deployment on one line: MODEL@GPUxN,key=value
launch     SGLang command lines for a deployment
interconnect  DeepEP all-to-all and KV-transfer costs from data/interconnect.yaml
disagg     prefill/decode disaggregation: what one prefill and one decode instance sustain (wide EP, EPLB)
pd_search  the search over PD shapes, and the colocated instance it is weighed against
pd_simulate  a PD deployment in virtual time (prefill queue, transfer, decode queue)
pd_versus  the plan's colocated answer beside the cheapest PD answer, and why one wins
disagg_launch  SGLang --disaggregation-mode and router command lines for a PD answer
validate_pd    the published PD / wide-EP runs replayed through disagg
confidence 90 % intervals of measured figures from repeats, and of a gain between two deployments
bootstrap  90 % intervals from one sweep: its stages' requests resampled, and a gain between two cells
paired     A/B on the same problems: the pass-rate difference with its 90 % interval, McNemar's p, a drop gate
"""

from bench.model import (
    backend,
    bootstrap,
    calibration,
    capacity,
    catalog,
    confidence,
    corpus,
    curve,
    disagg,
    disagg_launch,
    fit,
    format_table,
    formats,
    interconnect,
    interval,
    launch,
    pd_search,
    pd_simulate,
    pd_versus,
    perfmodel,
    plan,
    rate,
    scheduler,
    simulate,
    slo,
    spec,
    validate,
    validate_pd,
    workload,
)
from bench.model.bootstrap import StageSample, cell_gain, stage_sample
from bench.model.calibration import Efficiency, load_efficiency
from bench.model.capacity import Capacity, Deployment
from bench.model.confidence import Interval, behind_said, gain_interval, gain_words, mean_interval
from bench.model.option import HOURS_PER_MONTH, Config, Option
from bench.model.paired import Paired, Verdict, drop_gate, paired_difference
from bench.model.perfmodel import PerfModel, usd_per_million
from bench.model.plan import Plan, Question, make_plan, workload_names
from bench.model.rate import Prediction, search_rate, within_slo
from bench.model.scheduler import Request, Scheduler
from bench.model.simulate import Point, Sweep
from bench.model.slo import Slo, parse_slo
from bench.model.spec import Spec, parse_spec
from bench.model.workload import Workload, fixed_workload, load_workload

__all__ = [
    "Paired", "Verdict", "drop_gate", "paired_difference",
    "backend", "calibration", "capacity", "catalog", "corpus", "curve", "fit", "interval", "launch", "perfmodel",
    "plan", "rate",
    "scheduler", "simulate", "slo", "spec", "validate", "workload", "Efficiency", "load_efficiency",
    "Capacity", "Deployment", "HOURS_PER_MONTH", "Config", "Option", "PerfModel", "Plan", "Question", "make_plan",
    "workload_names", "Prediction", "search_rate", "within_slo",
    "Request", "Scheduler", "Point", "Sweep", "Slo", "parse_slo",
    "Spec", "parse_spec", "Workload", "fixed_workload", "load_workload", "usd_per_million",
    "disagg", "disagg_launch", "format_table", "formats", "interconnect", "pd_search", "pd_simulate", "pd_versus",
    "validate_pd",
    "confidence", "Interval", "behind_said", "gain_interval", "gain_words", "mean_interval",
    "bootstrap", "StageSample", "cell_gain", "stage_sample",
]
