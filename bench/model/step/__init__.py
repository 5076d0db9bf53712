"""What a step costs: one scheduler step's time on one instance (perfmodel: from the measured kernel tables,
kernels and kernel_step, with the roofline where no table covers the GPU or operator), the factors it is calibrated
with and where they come from (calibration), and DeepEP all-to-all and KV-transfer costs between GPUs
(interconnect)."""

from bench.model.step import calibration, interconnect, kernels, perfmodel
from bench.model.step.calibration import Efficiency, load_efficiency
from bench.model.step.perfmodel import PerfModel, usd_per_million

__all__ = ["calibration", "interconnect", "kernels", "perfmodel", "Efficiency", "load_efficiency", "PerfModel",
           "usd_per_million"]
