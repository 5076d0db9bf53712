"""How the GPU check times a call. Kernels: CUDA events around each of `iters` replays after `warmup` calls (which
also compile Triton kernels), replayed from a CUDA graph as SGLang decodes (launch overhead excluded), or eagerly
when capture fails, which the row then says. Calls that synchronise with the host (a checksum check reads its
verdict back): the host clock around the whole call, synchronised before and after. Off CUDA (the CPU run under
TRITON_INTERPRET=1) the host clock, for the shape of the output only."""

from __future__ import annotations

import statistics
import time

import torch


def device_ms(fn, device: torch.device, warmup: int, iters: int) -> tuple[float, str]:
    """(median milliseconds, how it was timed)."""
    for _ in range(warmup):
        fn()
    if device.type != "cuda":
        return host_ms(fn, device, 0, iters), "host clock (CPU interpreter)"
    run, mode = fn, "cuda events, cuda graph replay"
    try:
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            fn()
        run = graph.replay
    except Exception as e:  # noqa: BLE001 - the row says it was timed eagerly, and why
        torch.cuda.synchronize()
        mode = f"cuda events, eager (graph capture failed: {type(e).__name__})"
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        run()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times), mode


def host_ms(fn, device: torch.device, warmup: int, iters: int) -> float:
    """Median milliseconds on the host clock, the device idle before and finished after each call."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(iters):
        if device.type == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)
