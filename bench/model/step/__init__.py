"""What a step costs: one scheduler step's time on one instance (perfmodel), the factors it is calibrated with and
where they come from (calibration), and DeepEP all-to-all and KV-transfer costs between GPUs (interconnect); the
measured SGLang kernel tables (kernels) and a step priced from them (kernel_step)."""

from bench.model.step import calibration, interconnect, kernel_step, kernels, perfmodel
from bench.model.step.calibration import Efficiency, load_efficiency
from bench.model.step.perfmodel import PerfModel, usd_per_million

__all__ = ["calibration", "interconnect", "kernel_step", "kernels", "perfmodel", "Efficiency", "load_efficiency",
           "PerfModel", "usd_per_million"]
