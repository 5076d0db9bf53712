"""A results DB filled through the store's own writer, for the dashboard, browser and report tests: four runs of
known shape (Kimi K2 Thinking BF16 KV, FP8 KV, FP8 KV with KV checksums and one mismatch; GLM-4.6 FP8 KV with
KV checksums and no mismatch), each
with requests, GPU samples and server samples; the checksum run also with capbench_kv_* counters and integrity
events. Latencies are seeded, and chosen so the FP8 runs are faster (the tests assert on what the pages show)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from bench.store import BatchedWriter, Store

RUNS = [
    # label, config, tpot_s, ttft_s, checksum
    ("kimi bf16-kv", {"model": "kimi-k2-thinking", "gpu": "h200", "tp": 8, "kv_dtype": "bf16", "weights": "native",
                      "rate": 4.0}, 0.040, 0.30, False),
    ("kimi fp8-kv", {"model": "kimi-k2-thinking", "gpu": "h200", "tp": 8, "kv_dtype": "fp8_e4m3",
                     "weights": "native", "rate": 4.0}, 0.030, 0.25, False),
    ("kimi fp8-kv checksum", {"model": "kimi-k2-thinking", "gpu": "h200", "tp": 8, "kv_dtype": "fp8_e4m3",
                              "weights": "native", "rate": 4.0, "kv_checksum": "verify"}, 0.0302, 0.25, True),
    ("glm fp8-kv checksum", {"model": "glm-4.6", "gpu": "h200", "tp": 8, "kv_dtype": "fp8_e4m3",
                             "weights": "native", "rate": 4.0, "kv_checksum": "verify"}, 0.028, 0.20, "clean"),
]
DURATION_S = 30.0
GPUS = 8


def fill(path: Path, seed: int = 7) -> list[str]:
    """Write the four runs; returns their run ids in RUNS order."""
    store = Store(path)
    rng = np.random.default_rng(seed)
    ids = []
    for label, config, tpot, ttft, checksum in RUNS:
        run_id = store.start_run(label=label, target="http://127.0.0.1:30000", profile="poisson", config=config)
        t0 = store.run(run_id)["started_at"]
        with BatchedWriter(store, run_id, flush_interval_s=60) as w:
            _requests(w, rng, t0, config["rate"], tpot, ttft)
            _samples(w, rng, t0, checksum)
        store.finish_run(run_id)
        ids.append(run_id)
    return ids


def _requests(w, rng, t0: float, rate: float, tpot: float, ttft: float) -> None:
    n = int(rate * DURATION_S)
    due = t0 + 1.0 + np.sort(rng.uniform(0, DURATION_S - 10, n))
    out_tokens = rng.integers(200, 400, n)
    ttfts = ttft * rng.lognormal(0, 0.3, n)
    tpots = tpot * rng.lognormal(0, 0.1, n)
    itl = [list(np.round(t * rng.lognormal(0, 0.2, 16), 6)) for t in tpots]
    first = due + ttfts
    done = first + tpots * (out_tokens - 1)
    status = np.where(np.arange(n) % 50 == 49, "error", "ok")
    w.add_requests({
        "request_id": [f"r{i}" for i in range(n)], "phase": ["warmup" if i < 4 else "measured" for i in range(n)],
        "scheduled_at": due, "sent_at": due + 0.0004, "first_token_at": first, "finished_at": done,
        "itl_s": itl, "prompt_tokens": rng.integers(1500, 2500, n).astype(np.int32),
        "completion_tokens": out_tokens.astype(np.int32), "status": list(status),
        "error_kind": [None if s == "ok" else "http_500" for s in status],
    })


def _samples(w, rng, t0: float, checksum: bool) -> None:
    pages = verified = 0.0
    for k, t in enumerate(np.arange(t0, t0 + DURATION_S, 0.5)):
        busy = 1.0 if 1 < t - t0 < DURATION_S - 8 else 0.1
        for g in range(GPUS):
            w.add_gpu_sample({"t": float(t), "gpu": g, "name": "NVIDIA H200", "mem_used_mib": 130000.0 + g,
                              "mem_total_mib": 143771.0, "gpu_util_pct": 90 * busy + rng.uniform(0, 5),
                              "mem_util_pct": 70 * busy, "power_w": 200 + 450 * busy, "sm_clock_mhz": 1980.0,
                              "mem_clock_mhz": 3201.0, "temp_c": 40 + 25 * busy})
        for metric, value in (("sglang:num_running_reqs", 12 * busy), ("sglang:num_queue_reqs", 0.0),
                              ("sglang:token_usage", 0.3 * busy), ("sglang:gen_throughput", 1200 * busy)):
            w.add_server_sample({"t": float(t), "metric": metric, "labels": "", "value": value})
        if checksum:
            pages += 40 * busy
            verified += 25 * busy
            for metric, value in (("capbench_kv_pages_checksummed_total", pages),
                                  ("capbench_kv_pages_verified_total", verified),
                                  ("capbench_kv_checksum_seconds_total", 0.002 * k)):
                w.add_server_sample({"t": float(t), "metric": metric, "labels": "", "value": value})
            w.add_server_sample({"t": float(t), "metric": "capbench_kv_checksum_mismatch_total",
                                 "labels": '{"source": "reuse"}',
                                 "value": 1.0 if t - t0 > 12 and checksum != "clean" else 0.0})
    if checksum is True:
        w.add_integrity_event({"t": t0 + 12.2, "kind": "kv_checksum_mismatch", "layer": 17, "page": 4242,
                               "detail": '{"part": "latent", "node": 9, "source": "reuse"}'})
        w.add_integrity_event({"t": t0 + 12.2, "kind": "kv_checksum_action", "layer": None, "page": None,
                               "detail": '{"node": 9, "action": "evicted", "mode": "verify"}'})
