"""Samplers that run beside a load test, each on its own thread, handing rows to a sink (a BatchedWriter's
add_gpu_sample / add_server_sample). Neither ever raises into the load test: with no GPU the NVML sampler records
nothing and says so once; a server endpoint that is down, slow or talks garbage is counted and logged.
Timestamps are time.time() epoch seconds, the store's one clock."""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable

log = logging.getLogger(__name__)

Sink = Callable[[dict], None]

# The SGLang 0.5.23 metrics worth keeping (family names as prometheus_client reports them: counters lose _total).
SGLANG_METRICS = frozenset({
    "sglang:num_running_reqs", "sglang:num_queue_reqs", "sglang:token_usage", "sglang:gen_throughput",
    "sglang:cache_hit_rate", "sglang:prompt_tokens", "sglang:generation_tokens",
    "sglang:time_to_first_token_seconds", "sglang:inter_token_latency_seconds",
    "sglang:e2e_request_latency_seconds", "sglang:max_total_num_tokens", "sglang:kv_cache_memory_usage_gb",
    "sglang:weight_memory_usage_gb",
})
KV_PREFIX = "capbench_kv_"


def _every(period_s: float, stop: threading.Event, tick: Callable[[], None]) -> None:
    """Call tick every period_s on a fixed grid (no drift) until stop is set; a slow tick skips missed slots."""
    next_at = time.monotonic()
    while not stop.is_set():
        tick()
        next_at += period_s
        now = time.monotonic()
        if next_at < now:
            next_at = now + period_s - (now - next_at) % period_s
        stop.wait(next_at - now)


class GpuSampler:
    """NVML readings of all GPUs (or the chosen indices) hz times a second."""

    def __init__(self, sink: Sink, hz: float = 10.0, gpus: Iterable[int] | None = None):
        if not hz > 0:
            raise ValueError(f"hz must be positive, not {hz}")
        self.sink, self.hz = sink, hz
        self.gpus = None if gpus is None else list(gpus)
        self.available: bool | None = None  # None until start() has asked NVML
        self.samples = 0
        self.read_errors = 0  # readings this GPU does not support
        self.sink_errors = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._handles: list[tuple[int, object, str]] = []

    def start(self) -> GpuSampler:
        if os.environ.get("CAPBENCH_GPU_TELEMETRY") == "off":  # set by callers that know there is no GPU to watch
            self.available = False
            return self
        try:
            import pynvml

            pynvml.nvmlInit()
            count = pynvml.nvmlDeviceGetCount()
            indices = range(count) if self.gpus is None else [i for i in self.gpus if 0 <= i < count]
            for i in indices:
                h = pynvml.nvmlDeviceGetHandleByIndex(i)
                name = pynvml.nvmlDeviceGetName(h)
                self._handles.append((i, h, name.decode() if isinstance(name, bytes) else name))
        except Exception as e:  # pynvml.NVMLError (no driver, no GPU) or no pynvml at all
            self.available = False
            log.warning("GPU telemetry off: NVML unavailable (%s)", e.__class__.__name__ + (f": {e}" if str(e) else ""))
            return self
        if not self._handles:
            self.available = False
            log.warning("GPU telemetry off: no matching GPU (asked for %s)", self.gpus)
            return self
        self.available = True
        self._thread = threading.Thread(target=_every, args=(1 / self.hz, self._stop, self._tick),
                                        name="capbench-gpu-sampler", daemon=True)
        self._thread.start()
        return self

    def _tick(self) -> None:
        try:
            self._sample()
        except Exception as e:  # e.g. the sink's writer already closed: say so once, keep the load test alive
            self.sink_errors += 1
            if self.sink_errors == 1:
                log.warning("GPU sampler: %r", e)

    def _read(self, fn: Callable, *args) -> object | None:
        """One NVML reading; None (a NULL in the table) where this GPU does not support it."""
        try:
            return fn(*args)
        except Exception:
            self.read_errors += 1
            return None

    def _sample(self) -> None:
        import pynvml as nv

        t = time.time()
        for index, h, name in self._handles:
            mem = self._read(nv.nvmlDeviceGetMemoryInfo, h)
            util = self._read(nv.nvmlDeviceGetUtilizationRates, h)
            power_mw = self._read(nv.nvmlDeviceGetPowerUsage, h)
            sm = self._read(nv.nvmlDeviceGetClockInfo, h, nv.NVML_CLOCK_SM)
            memclk = self._read(nv.nvmlDeviceGetClockInfo, h, nv.NVML_CLOCK_MEM)
            temp = self._read(nv.nvmlDeviceGetTemperature, h, nv.NVML_TEMPERATURE_GPU)
            self.sink({
                "t": t, "gpu": index, "name": name,
                "mem_used_mib": None if mem is None else mem.used / 2**20,
                "mem_total_mib": None if mem is None else mem.total / 2**20,
                "gpu_util_pct": None if util is None else float(util.gpu),
                "mem_util_pct": None if util is None else float(util.memory),
                "power_w": None if power_mw is None else power_mw / 1000.0,
                "sm_clock_mhz": None if sm is None else float(sm),
                "mem_clock_mhz": None if memclk is None else float(memclk),
                "temp_c": None if temp is None else float(temp),
            })
            self.samples += 1

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self.available:
            try:
                import pynvml

                pynvml.nvmlShutdown()
            except Exception:
                pass
            self.available = None


class Scraper:
    """An HTTP poller on a thread of its own: `_tick` every period_s with one httpx client. A failure is counted by
    kind in `failures` and logged the first time, then every 100th (a dead endpoint must not flood the log)."""

    what = "scraper"  # how the log names it
    log = log  # the module's logger of the subclass, where it has its own

    def __init__(self, period_s: float, timeout_s: float, headers: dict | None = None):
        self.period_s, self.timeout_s, self.headers = period_s, timeout_s, headers or {}
        self.failures: Counter[str] = Counter()
        self.scrapes = 0
        self.samples = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._client = None

    def start(self) -> Scraper:
        import httpx

        self._client = httpx.Client(timeout=self.timeout_s, headers=self.headers)
        self._thread = threading.Thread(target=_every, args=(self.period_s, self._stop, self._tick),
                                        name=f"capbench-{self.what.replace(' ', '-')}", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self._client is not None:
            self._client.close()
            self._client = None

    def _fail(self, where: str, kind: str, detail: str) -> None:
        key = f"{where}:{kind}"
        self.failures[key] += 1
        n = self.failures[key]
        if n == 1 or n % 100 == 0:
            self.log.warning("%s: %s %s (%d so far): %s", self.what, where, kind, n, detail[:200])

    def _tick(self) -> None:
        raise NotImplementedError


class ServerSampler(Scraper):
    """Scrapes <base_url>/metrics (Prometheus text) and /server_info (or the older /get_server_info) every
    interval_ms. Keeps SGLANG_METRICS and capbench_kv_* samples; from server_info, the numbers in
    internal_states[i] (labelled by i) every time, and its top-level numbers when first seen or changed. Failures
    are counted by kind in `failures`, never raised."""

    what = "server sampler"

    def __init__(self, base_url: str, sink: Sink, interval_ms: float = 500, timeout_s: float | None = None,
                 headers: dict | None = None):
        if not interval_ms > 0:
            raise ValueError(f"interval_ms must be positive, not {interval_ms}")
        super().__init__(interval_ms / 1000,
                         timeout_s if timeout_s is not None else max(0.2, min(2.0, interval_ms / 1000)), headers)
        self.base_url = base_url.rstrip("/")
        self.sink, self.interval_ms = sink, interval_ms
        self.last_server_info: dict | None = None
        self._top_level: dict[str, float] = {}
        self._info_path = "/server_info"

    def _get(self, endpoint: str, path: str) -> str | None:
        import httpx

        try:
            r = self._client.get(self.base_url + path)
        except httpx.TimeoutException as e:
            self._fail(endpoint, "timeout", repr(e))
            return None
        except httpx.HTTPError as e:
            self._fail(endpoint, "down", repr(e))
            return None
        if r.status_code != 200:
            self._fail(endpoint, f"http_{r.status_code}", r.text)
            return None
        return r.text

    def _tick(self) -> None:
        try:
            self.scrapes += 1
            t = time.time()
            self._scrape_metrics(t)
            self._scrape_server_info(t)
        except Exception as e:  # whatever else goes wrong, the sampler lives on
            self._fail("sampler", "error", repr(e))

    def _scrape_metrics(self, t: float) -> None:
        from prometheus_client.parser import text_string_to_metric_families

        text = self._get("metrics", "/metrics")
        if text is None:
            return
        rows = []
        try:
            for family in text_string_to_metric_families(text):
                if family.name not in SGLANG_METRICS and not family.name.startswith(KV_PREFIX):
                    continue
                for s in family.samples:
                    rows.append({"t": t, "metric": s.name, "labels": json.dumps(s.labels, sort_keys=True),
                                 "value": float(s.value)})
        except Exception as e:  # the parser raises ValueError and friends on garbage
            self._fail("metrics", "garbage", repr(e))
            return
        for row in rows:
            self.sink(row)
        self.samples += len(rows)

    def _scrape_server_info(self, t: float) -> None:
        text = self._get("server_info", self._info_path)
        if text is None and self._info_path == "/server_info" and self.failures["server_info:http_404"]:
            self._info_path = "/get_server_info"  # SGLang before /server_info
            text = self._get("server_info", self._info_path)
        if text is None:
            return
        try:
            info = json.loads(text)
            if not isinstance(info, dict):
                raise ValueError(f"expected a JSON object, got {type(info).__name__}")
        except ValueError as e:
            self._fail("server_info", "garbage", repr(e))
            return
        self.last_server_info = info
        # Top-level numbers are mostly server arguments (port, tp_size, ...): kept when first seen or changed.
        rows = []
        for k, v in info.items():
            if _is_number(v) and self._top_level.get(k) != v:
                self._top_level[k] = v
                rows.append({"t": t, "metric": f"server_info:{k}", "labels": "{}", "value": float(v)})
        for i, state in enumerate(info.get("internal_states") or []):
            for key, v in _flatten(state):
                rows.append({"t": t, "metric": f"server_info:{key}", "labels": json.dumps({"dp": str(i)}),
                             "value": float(v)})
        for row in rows:
            self.sink(row)
        self.samples += len(rows)


def _is_number(v: object) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


def _flatten(obj: object, prefix: str = "") -> Iterable[tuple[str, float]]:
    """Numeric leaves of nested dicts as ('memory_usage.kvcache', 12.5)."""
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from _flatten(v, f"{prefix}{k}.")
    elif _is_number(obj):
        yield prefix.rstrip("."), obj
