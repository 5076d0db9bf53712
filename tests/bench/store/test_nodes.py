"""GPU telemetry from the GPU nodes: DCGM exporter text parsed per node and GPU, and a sampler that outlives
endpoints that are down, slow or talk garbage (a fake exporter on 127.0.0.1: dcgm_exporter.py)."""

from __future__ import annotations

import json
import logging
import time

import pytest

from bench.store.nodes import NodeSampler, endpoint_node, parse_dcgm
from tests.bench.store.dcgm_exporter import TOTAL_MIB, FakeDcgm, text, values


def _wait(cond, timeout=10.0):
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline
        time.sleep(0.02)


def test_dcgm_text_maps_to_one_row_per_gpu_with_its_values():
    gpus, prof = parse_dcgm(text(7), "127.0.0.1:9400", 123.0)
    assert sorted(r["gpu"] for r in gpus) == [0, 1]
    for r in gpus:
        v = values(7, r["gpu"])
        assert r["node"] == "gpu-node-1" and r["name"] == "NVIDIA H200" and r["t"] == 123.0
        assert r["gpu_util_pct"] == v["DCGM_FI_DEV_GPU_UTIL"]
        assert r["mem_used_mib"] == v["DCGM_FI_DEV_FB_USED"]
        assert r["mem_total_mib"] == pytest.approx(TOTAL_MIB)
        assert r["power_w"] == v["DCGM_FI_DEV_POWER_USAGE"] and r["sm_clock_mhz"] == v["DCGM_FI_DEV_SM_CLOCK"]
        assert r["mem_util_pct"] == v["DCGM_FI_DEV_MEM_COPY_UTIL"] and r["temp_c"] == v["DCGM_FI_DEV_GPU_TEMP"]
    # the profiling fields, which gpu_samples has no column for, as server samples labelled by node, GPU and UUID
    assert {r["metric"] for r in prof} == {"DCGM_FI_PROF_GR_ENGINE_ACTIVE", "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
                                           "DCGM_FI_PROF_DRAM_ACTIVE"}
    tensor = {json.loads(r["labels"])["gpu"]: r["value"] for r in prof if r["metric"].endswith("TENSOR_ACTIVE")}
    assert tensor == {"0": 0.21, "1": 0.21}
    assert json.loads(prof[0]["labels"])["UUID"].startswith("GPU-")


def test_without_a_hostname_label_the_node_is_the_endpoint():
    gpus, _ = parse_dcgm(text(0).replace('Hostname="gpu-node-1",', ""), endpoint_node("http://10.0.0.5:9400/metrics"),
                         1.0)
    assert {r["node"] for r in gpus} == {"10.0.0.5:9400"}


def test_sampler_scrapes_every_node_and_survives_bad_ones(caplog):
    good, other, garbage, slow = FakeDcgm(), FakeDcgm(hostname="gpu-node-2"), FakeDcgm("garbage"), FakeDcgm("hang")
    rows, prof = [], []
    urls = [good.url, other.url, garbage.url, slow.url, "http://127.0.0.1:9/metrics"]
    s = NodeSampler(urls, rows.append, prof.append, interval_s=0.2, timeout_s=0.3)
    try:
        with caplog.at_level(logging.WARNING, logger="bench.store.nodes"):
            s.start()
            _wait(lambda: s.scrapes >= 4, 20)
            s.stop()
    finally:
        for x in (good, other, garbage, slow):
            x.close()
    nodes = {r["node"] for r in rows}
    assert nodes == {"gpu-node-1", "gpu-node-2"}
    for r in rows:  # each row is one served scrape's values for its GPU
        served = (good if r["node"] == "gpu-node-1" else other).served
        assert any(r["gpu_util_pct"] == sc[r["gpu"]]["DCGM_FI_DEV_GPU_UTIL"]
                   and r["mem_used_mib"] == sc[r["gpu"]]["DCGM_FI_DEV_FB_USED"] for sc in served)
    assert len({r["gpu_util_pct"] for r in rows if r["node"] == "gpu-node-1" and r["gpu"] == 0}) >= 3
    kinds = {k.split(":", 1)[1].rsplit(":", 1)[-1] for k in s.failures}
    assert {"timeout", "down"} <= kinds and ("garbage" in kinds or "no_dcgm" in kinds)
    # each failure said once (then every 100th), not at every scrape
    said = [r for r in caplog.records if "GPU node telemetry" in r.getMessage()]
    assert len(said) == len(s.failures) and all(n >= 3 for n in s.failures.values())
