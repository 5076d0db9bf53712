"""What crossing the interconnect costs: DeepEP's MoE all-to-all (normal kernels for prefill, low-latency kernels
for decode) by EP size and node count, and the KV cache's transfer from a prefill to a decode instance.

The all-to-all is scaled from DeepEP's published measurements (data/interconnect.yaml, H800 with one 400 Gb/s
CX7 NIC per GPU): a rank sends its tokens' hidden states to top_k experts (FP8 on dispatch, BF16 on combine), so
the bytes are tokens * top_k * hidden * (1 + 2), and the time is bytes / the bandwidth DeepEP reached at that EP
size, scaled by this GPU's link over the H800's (NVLink within one node, the NIC past it). Between measured EP
sizes the bandwidth is interpolated in log2(EP); past the largest it stays at the largest's. The low-latency
table also gives the time at 128 tokens per rank, which the bytes / bandwidth rule reproduces (77 us at EP8).

A KV transfer moves a request's whole per-token KV (MLA: the latent, the same on every rank) over the prefill
rank's NIC: bytes / (NIC * kv_transfer_eff) + kv_transfer_setup_ms. Those two and the router's latency are
assumptions no source publishes; `assumptions()` lists them for the Planner and the report.
"""

from __future__ import annotations

import math
from functools import cache

import yaml

from bench.model.fits.catalog import DATA, GPU

FILE = DATA / "interconnect.yaml"


@cache
def facts() -> dict:
    return yaml.safe_load(FILE.read_text())


def assumptions() -> dict[str, float]:
    """The figures the disaggregated model assumes (not published), by name."""
    return dict(facts()["assumed"])


def _interpolate(table: dict, ep: int) -> float:
    points = sorted((int(k), float(v)) for k, v in table.items())
    if ep <= points[0][0]:
        return points[0][1]
    for (e0, v0), (e1, v1) in zip(points, points[1:], strict=False):
        if ep <= e1:
            w = (math.log2(ep) - math.log2(e0)) / (math.log2(e1) - math.log2(e0))
            return v0 + w * (v1 - v0)
    return points[-1][1]


def _link_scale(gpu: GPU, ep: int) -> float:
    """This GPU's link over the one DeepEP measured on: NVLink within a node, the NIC across nodes."""
    measured = facts()["deepep"]["measured_on"]
    if ep <= gpu.gpus_per_node:
        return gpu.interconnect_gbps / 2 / measured["nvlink_gbps_per_direction"]
    return gpu.internode_gbps / measured["nic_gbps"]


def all_to_all_s(gpu: GPU, ep: int, tokens_per_rank: float, hidden: int, top_k: int, mode: str) -> float:
    """Seconds of one MoE layer's dispatch + combine on one rank (mode: 'normal' or 'low_latency')."""
    if ep <= 1 or tokens_per_rank <= 0:
        return 0.0
    table = facts()["deepep"][mode]
    if mode == "normal" and ep > gpu.gpus_per_node and ep <= 8:
        ep = 16  # nodes smaller than 8 GPUs: the internode figures apply
    scale = _link_scale(gpu, ep)
    dispatch = tokens_per_rank * top_k * hidden * 1.0 / (_interpolate(table["dispatch_gbps"], ep) * 1e9 * scale)
    combine = tokens_per_rank * top_k * hidden * 2.0 / (_interpolate(table["combine_gbps"], ep) * 1e9 * scale)
    return dispatch + combine


def kv_transfer_s(gpu: GPU, kv_bytes: float) -> float:
    """Seconds to move one request's KV from a prefill rank to a decode rank over the NIC."""
    a = assumptions()
    return kv_bytes / (gpu.internode_gbps * 1e9 * a["kv_transfer_eff"]) + a["kv_transfer_setup_ms"] * 1e-3


def nic_bytes_per_s(gpu: GPU) -> float:
    """What one GPU's NIC moves per second at the assumed transfer efficiency (the KV-transfer ceiling)."""
    return gpu.internode_gbps * 1e9 * assumptions()["kv_transfer_eff"]
