"""What we predict: pure arithmetic on data/ (no DB, no HTTP, no GPU).

catalog    model and GPU facts from data/ (+ the user's override file)
capacity   SGLang 0.5.23's memory arithmetic: weights per GPU, KV pool tokens, sequences that fit
perfmodel  step times of one instance (roofline terms with calibrated efficiencies), and cost
scheduler  continuous batching on the KV budget, as SGLang's scheduler does it (the twin runs it too)
workload   request mixes as the simulator draws them
slo        the SLO: a per-request bound (goodput) and a percentile bound (the highest rate within it)
simulate   the scheduler in virtual time: one rate, or a sweep to the highest rate within the SLO
plan       the planning question and its answer: options compared, rate per instance, GPUs and cost
spec       a deployment on one line: MODEL@GPUxN,key=value
launch     SGLang command lines for a deployment
"""

from bench.model import capacity, catalog, launch, perfmodel, plan, scheduler, simulate, slo, spec, workload
from bench.model.capacity import Capacity, Deployment
from bench.model.perfmodel import Efficiency, PerfModel, load_efficiency
from bench.model.plan import (
    HOURS_PER_MONTH,
    Option,
    Plan,
    Prediction,
    Question,
    make_plan,
    on_other_gpus,
    search_rate,
    workload_names,
)
from bench.model.scheduler import Request, Scheduler
from bench.model.simulate import Point, Sweep
from bench.model.slo import Slo, parse_slo
from bench.model.spec import Spec, parse_spec
from bench.model.workload import Workload, fixed_workload, load_workload

__all__ = [
    "capacity", "catalog", "launch", "perfmodel", "plan", "scheduler", "simulate", "slo", "spec", "workload",
    "Capacity", "Deployment", "Efficiency", "PerfModel", "load_efficiency", "HOURS_PER_MONTH", "Option", "Plan",
    "Prediction", "Question", "make_plan", "on_other_gpus", "search_rate", "workload_names", "Request", "Scheduler",
    "Point", "Sweep", "Slo", "parse_slo", "Spec", "parse_spec", "Workload", "fixed_workload", "load_workload",
]
