"""How a server schedules and queues: request mixes (workload), continuous batching on the KV budget as SGLang's
scheduler does it (scheduler, queues), the SLO (slo), the scheduler in virtual time (simulate) and the one search for
the highest rate an instance serves within the SLO (rate), which `plan` and `simulate --sweep` both use."""

from bench.model.serving import queues, rate, scheduler, simulate, slo, sweep, workload
from bench.model.serving.rate import Prediction, search_rate, within_slo
from bench.model.serving.scheduler import Request, Scheduler
from bench.model.serving.simulate import Point, Sweep
from bench.model.serving.slo import Slo, parse_slo
from bench.model.serving.workload import Workload, fixed_workload, load_workload

__all__ = ["queues", "rate", "scheduler", "simulate", "slo", "sweep", "workload", "Prediction", "search_rate",
           "within_slo",
           "Request", "Scheduler", "Point", "Sweep", "Slo", "parse_slo", "Workload", "fixed_workload",
           "load_workload"]
