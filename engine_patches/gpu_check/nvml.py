"""NVML samples on the check's own timeline: a thread reads power, utilisation, memory and SM clock every
`period_s`; each case records when it ran, so every case gets the samples taken while it ran."""

from __future__ import annotations

import threading
import time


class NvmlSampler:
    def __init__(self, device_index: int = 0, period_s: float = 0.02):
        import pynvml  # nvidia-ml-py; an NVMLError here is the caller's error line

        pynvml.nvmlInit()
        self._nvml = pynvml
        self._handle = pynvml.nvmlDeviceGetHandleByIndex(device_index)
        self.period_s = period_s
        self.samples: list[dict] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self.t0 = time.monotonic()

    def _loop(self) -> None:
        n, h = self._nvml, self._handle
        while not self._stop.is_set():
            util = n.nvmlDeviceGetUtilizationRates(h)
            self.samples.append({
                "t_s": round(time.monotonic() - self.t0, 4),
                "power_w": n.nvmlDeviceGetPowerUsage(h) / 1e3, "gpu_util": util.gpu, "mem_util": util.memory,
                "mem_used_gib": n.nvmlDeviceGetMemoryInfo(h).used / 2**30,
                "sm_clock_mhz": n.nvmlDeviceGetClockInfo(h, n.NVML_CLOCK_SM)})
            self._stop.wait(self.period_s)

    def start(self) -> NvmlSampler:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()
        self._nvml.nvmlShutdown()

    def during(self, t_start: float, t_end: float) -> dict:
        """Summary of the samples taken between two times of this sampler's clock (seconds since t0)."""
        inside = [s for s in self.samples if t_start <= s["t_s"] <= t_end]
        if not inside:
            return {"samples": 0}
        return {"samples": len(inside), "power_w_mean": sum(s["power_w"] for s in inside) / len(inside),
                "power_w_max": max(s["power_w"] for s in inside), "gpu_util_max": max(s["gpu_util"] for s in inside),
                "sm_clock_mhz_min": min(s["sm_clock_mhz"] for s in inside)}
