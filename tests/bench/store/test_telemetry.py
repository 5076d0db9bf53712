"""The samplers against a real local HTTP server (127.0.0.1) that misbehaves, and against this machine's NVML."""

from __future__ import annotations

import json
import logging
import re
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from bench.store import GpuSampler, ServerSampler

GOOD_METRICS = """\
# HELP sglang:num_running_reqs The number of running requests.
# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{model_name="kimi",engine_type="unified"} 7.0
# HELP sglang:prompt_tokens_total Number of prefill tokens processed.
# TYPE sglang:prompt_tokens_total counter
sglang:prompt_tokens_total{model_name="kimi"} 12345.0
# HELP sglang:time_to_first_token_seconds Histogram of time to first token in seconds.
# TYPE sglang:time_to_first_token_seconds histogram
sglang:time_to_first_token_seconds_bucket{le="0.1",model_name="kimi"} 3.0
sglang:time_to_first_token_seconds_bucket{le="+Inf",model_name="kimi"} 5.0
sglang:time_to_first_token_seconds_count{model_name="kimi"} 5.0
sglang:time_to_first_token_seconds_sum{model_name="kimi"} 0.9
# TYPE capbench_kv_pages_verified_total counter
capbench_kv_pages_verified_total{source="reuse"} 42.0
# TYPE python_gc_objects_collected_total counter
python_gc_objects_collected_total{generation="0"} 99.0
"""
SERVER_INFO = {"max_total_num_tokens": 500000, "last_gen_throughput": 1234.5, "version": "0.5.23",
               "internal_states": [{"memory_usage": {"weight": 60.5, "kvcache": 70.25, "token_capacity": 500000},
                                    "last_gen_throughput": 1234.5}]}


class Server:
    """/metrics answers according to `mode`; /server_info is 404 (an older SGLang), /get_server_info works."""

    def __init__(self):
        self.mode = "good"
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_GET(self):
                if self.path == "/metrics":
                    if server.mode == "hang":
                        time.sleep(1.0)
                    status, body = {"good": (200, GOOD_METRICS), "garbage": (200, "<html>{{ not metrics"),
                                    "error": (500, "internal error"), "hang": (200, GOOD_METRICS)}[server.mode]
                elif self.path == "/get_server_info":
                    status, body = 200, json.dumps(SERVER_INFO)
                else:
                    status, body = 404, "not found"
                try:
                    self.send_response(status)
                    self.end_headers()
                    self.wfile.write(body.encode())
                except OSError:  # the client gave up on a hanging answer
                    pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


def _wait(cond, timeout=10.0):
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.02)


def test_server_sampler_keeps_sglang_and_kv_metrics_and_falls_back_to_get_server_info():
    server = Server()
    rows = []
    sampler = ServerSampler(server.url, rows.append, interval_ms=50, timeout_s=5).start()  # a busy CI box is slow
    try:
        _wait(lambda: sampler.scrapes >= 3)
    finally:
        sampler.stop()
        server.close()
    names = {r["metric"] for r in rows}
    assert {"sglang:num_running_reqs", "sglang:prompt_tokens_total", "sglang:time_to_first_token_seconds_bucket",
            "sglang:time_to_first_token_seconds_sum", "capbench_kv_pages_verified_total",
            "server_info:max_total_num_tokens", "server_info:memory_usage.kvcache"} <= names
    assert not any(n.startswith("python_gc") for n in names)
    running = next(r for r in rows if r["metric"] == "sglang:num_running_reqs")
    assert running["value"] == 7.0 and json.loads(running["labels"])["model_name"] == "kimi"
    kv = next(r for r in rows if r["metric"] == "server_info:memory_usage.kvcache")
    assert kv["value"] == 70.25 and json.loads(kv["labels"]) == {"dp": "0"}
    assert sampler.failures["server_info:http_404"] == 1  # asked once, then stayed on the old path
    per_metric = {n: sum(r["metric"] == n for r in rows) for n in names}
    assert per_metric["server_info:max_total_num_tokens"] == 1  # a server argument: stored once, not every scrape
    assert per_metric["server_info:memory_usage.kvcache"] == sampler.scrapes  # a live reading: every scrape
    assert sampler.last_server_info["version"] == "0.5.23"


def test_server_sampler_counts_garbage_500s_hangs_and_a_dead_server_and_keeps_going(caplog):
    caplog.set_level(logging.WARNING, logger="bench.telemetry")
    server = Server()
    rows = []
    sampler = ServerSampler(server.url, rows.append, interval_ms=50, timeout_s=0.2).start()
    try:
        for mode, failure in (("garbage", "metrics:garbage"), ("error", "metrics:http_500"),
                              ("hang", "metrics:timeout")):
            server.mode = mode
            _wait(lambda f=failure: sampler.failures[f] >= 2)
        server.mode = "good"
        before = len(rows)
        _wait(lambda: any(r["metric"] == "sglang:num_running_reqs" for r in rows[before:]))
        server.close()
        _wait(lambda: sampler.failures["metrics:down"] >= 2)
        assert sampler._thread.is_alive()
    finally:
        sampler.stop()
    assert "Traceback" not in caplog.text
    assert caplog.text.count("metrics garbage (1 so far)") == 1  # logged once, not once a scrape


def test_gpu_sampler_on_this_machine():
    rows = []
    try:
        import pynvml

        pynvml.nvmlInit()
        pynvml.nvmlShutdown()
        has_gpu = True
    except pynvml.NVMLError:
        has_gpu = False
    sampler = GpuSampler(rows.append, hz=20).start()
    time.sleep(0.3)
    sampler.stop()
    if has_gpu:
        assert rows and {"t", "gpu", "name", "mem_used_mib", "mem_total_mib"} <= rows[0].keys()
        assert 0 < rows[0]["mem_used_mib"] <= rows[0]["mem_total_mib"]
    else:
        assert rows == [] and sampler.samples == 0


def test_gpu_sampler_without_nvml_says_so_once_without_a_traceback(caplog):
    import pynvml

    try:
        pynvml.nvmlInit()
        pynvml.nvmlShutdown()
        gpu_here = True
    except pynvml.NVMLError:
        gpu_here = False
    rows = []
    # With a GPU, ask for one that does not exist; without one, NVML itself refuses.
    sampler = GpuSampler(rows.append, gpus=[10_000] if gpu_here else None).start()
    time.sleep(0.2)
    sampler.stop()
    assert sampler.available is False
    assert rows == []
    warnings = [r for r in caplog.records if r.name == "bench.store.telemetry"]
    assert len(warnings) == 1 and "GPU telemetry off" in warnings[0].getMessage()
    assert warnings[0].exc_info is None and "Traceback" not in caplog.text


def test_sampler_rates_must_be_positive():
    with pytest.raises(ValueError):
        GpuSampler(print, hz=0)
    with pytest.raises(ValueError):
        ServerSampler("http://127.0.0.1:1", print, interval_ms=-5)


def test_a_sink_that_fails_does_not_kill_the_server_sampler(caplog):
    server = Server()
    calls = []

    def sink(row):
        calls.append(row)
        raise RuntimeError("writer for run x is closed")

    sampler = ServerSampler(server.url, sink, interval_ms=50).start()
    try:
        _wait(lambda: sampler.failures["sampler:error"] >= 3)
        assert sampler._thread.is_alive()
    finally:
        sampler.stop()
        server.close()
    assert len(calls) >= 3


def test_server_sampler_reads_the_twin():
    """The twin (bench/twin.py) speaks SGLang's /metrics and /server_info: everything parses, nothing fails."""
    import os
    import subprocess
    import sys

    proc = subprocess.Popen([sys.executable, "-c", "from bench.cli import main; main()", "twin", "--port", "0"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "COLUMNS": "200"})
    rows = []
    try:
        url = None
        deadline = time.monotonic() + 60
        while url is None and time.monotonic() < deadline:
            line = proc.stdout.readline()
            assert line, "the twin exited before serving"
            if m := re.search(r"http://127\.0\.0\.1:\d+", line):
                url = m.group(0)
        sampler = ServerSampler(url, rows.append, interval_ms=100, timeout_s=5).start()
        _wait(lambda: sampler.scrapes >= 3)
        sampler.stop()
    finally:
        proc.kill()
        proc.wait(timeout=10)
    assert not sampler.failures, dict(sampler.failures)
    names = {r["metric"] for r in rows}
    assert {"sglang:num_running_reqs", "sglang:num_queue_reqs", "sglang:token_usage", "sglang:gen_throughput",
            "sglang:time_to_first_token_seconds_bucket", "server_info:max_total_num_tokens"} <= names


def test_every_nvml_call_the_gpu_sampler_makes_exists_in_the_binding():
    """No GPU here to call them on; at least the names the sampler uses must be in nvidia-ml-py's pynvml."""
    import inspect

    import pynvml

    from bench.store import telemetry

    source = inspect.getsource(telemetry.GpuSampler)
    used = set(re.findall(r"\b(?:pynvml|nv)\.(\w+)", source))
    assert {"nvmlInit", "nvmlDeviceGetMemoryInfo", "nvmlDeviceGetPowerUsage", "NVML_CLOCK_SM"} <= used
    assert [name for name in used if not hasattr(pynvml, name)] == []
