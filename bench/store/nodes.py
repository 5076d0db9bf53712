"""GPU telemetry from the GPU nodes: a Prometheus text endpoint on each node (NVIDIA's DCGM exporter, usually
http://NODE:9400/metrics), scraped on a thread of its own beside the load test, like telemetry.py's samplers.

DCGM's device fields land in gpu_samples beside the NVML rows, one row per node and GPU per scrape, `node` saying
where (the exporter's Hostname label, else the endpoint's host:port); the DCGM_FI_PROF_* fields, which have no
column there, go to server_samples with the node, GPU index and UUID as labels. An endpoint that is down, slow or
talks garbage is counted in `failures` and logged once (then every 100th time), never raised into the load test.
"""

from __future__ import annotations

import json
import logging
import time
from urllib.parse import urlsplit

from bench.store.telemetry import Scraper, Sink

log = logging.getLogger(__name__)

# DCGM exporter field -> gpu_samples column (units as DCGM gives them: MiB, %, W, MHz, degrees C)
DCGM_COLUMNS = {
    "DCGM_FI_DEV_GPU_UTIL": "gpu_util_pct",
    "DCGM_FI_DEV_MEM_COPY_UTIL": "mem_util_pct",
    "DCGM_FI_DEV_FB_USED": "mem_used_mib",
    "DCGM_FI_DEV_POWER_USAGE": "power_w",
    "DCGM_FI_DEV_SM_CLOCK": "sm_clock_mhz",
    "DCGM_FI_DEV_MEM_CLOCK": "mem_clock_mhz",
    "DCGM_FI_DEV_GPU_TEMP": "temp_c",
}
MEMORY_PARTS = ("DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_FREE", "DCGM_FI_DEV_FB_RESERVED")  # their sum: the total
PROF_PREFIX = "DCGM_FI_PROF_"


def endpoint_node(url: str) -> str:
    """The node an endpoint stands for when its samples carry no Hostname label: its host:port."""
    parts = urlsplit(url)
    return parts.netloc.rpartition("@")[2] or url


def parse_dcgm(text: str, node: str, t: float) -> tuple[list[dict], list[dict]]:
    """(gpu_samples rows, server_samples rows) of one scrape; ValueError on text that is not Prometheus."""
    from prometheus_client.parser import text_string_to_metric_families

    gpus: dict[tuple[str, int], dict] = {}
    memory: dict[tuple[str, int], float] = {}
    prof = []
    for family in text_string_to_metric_families(text):
        column = DCGM_COLUMNS.get(family.name)
        if column is None and family.name not in MEMORY_PARTS and not family.name.startswith(PROF_PREFIX):
            continue
        for s in family.samples:
            try:
                index = int(s.labels.get("gpu", ""))
            except ValueError:  # not a per-GPU sample (a MIG instance's or a switch's carry other labels)
                continue
            where = s.labels.get("Hostname") or node
            key = (where, index)
            value = float(s.value)
            if family.name.startswith(PROF_PREFIX):
                labels = {"node": where, "gpu": str(index), "UUID": s.labels.get("UUID", "")}
                prof.append({"t": t, "metric": family.name, "labels": json.dumps(labels, sort_keys=True),
                             "value": value})
                continue
            row = gpus.setdefault(key, {"t": t, "gpu": index, "node": where, "name": s.labels.get("modelName")})
            if column is not None:
                row[column] = value
            if family.name in MEMORY_PARTS:
                memory[key] = memory.get(key, 0.0) + value
    for key, total in memory.items():
        gpus[key]["mem_total_mib"] = total
    return list(gpus.values()), prof


class NodeSampler(Scraper):
    """Scrapes each endpoint every interval_s; rows to gpu_sink (gpu_samples) and prof_sink (server_samples)."""

    what = "GPU node telemetry"
    log = log

    def __init__(self, urls: list[str], gpu_sink: Sink, prof_sink: Sink, interval_s: float = 1.0,
                 timeout_s: float | None = None):
        if not interval_s > 0:
            raise ValueError(f"interval_s must be positive, not {interval_s}")
        # a slow node must not hold the others' scrapes past the next tick
        super().__init__(interval_s, timeout_s if timeout_s is not None
                         else max(0.2, min(2.0, interval_s / max(1, len(urls)))))
        self.urls = list(urls)
        self.gpu_sink, self.prof_sink, self.interval_s = gpu_sink, prof_sink, interval_s

    def _tick(self) -> None:
        self.scrapes += 1
        for url in self.urls:
            try:
                self._scrape(url)
            except Exception as e:  # whatever else goes wrong, the sampler and the load test live on
                self._fail(endpoint_node(url), "error", repr(e))

    def _scrape(self, url: str) -> None:
        import httpx

        t = time.time()
        try:
            r = self._client.get(url)
        except httpx.TimeoutException as e:
            self._fail(endpoint_node(url), "timeout", repr(e))
            return
        except httpx.HTTPError as e:
            self._fail(endpoint_node(url), "down", repr(e))
            return
        if r.status_code != 200:
            self._fail(endpoint_node(url), f"http_{r.status_code}", r.text)
            return
        try:
            gpu_rows, prof_rows = parse_dcgm(r.text, endpoint_node(url), t)
        except Exception as e:  # the parser raises ValueError and friends on garbage
            self._fail(endpoint_node(url), "garbage", repr(e))
            return
        if not gpu_rows and not prof_rows:
            self._fail(endpoint_node(url), "no_dcgm", "the endpoint answers, but with no DCGM_FI_* sample per GPU")
            return
        for row in gpu_rows:
            self.gpu_sink(row)
        for row in prof_rows:
            self.prof_sink(row)
        self.samples += len(gpu_rows)
