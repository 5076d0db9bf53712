"""Latency histograms as the store keeps them: log-linear buckets of a float's exponent and top mantissa bits."""

from __future__ import annotations

import numpy as np

# Latency histograms, log-linear like HdrHistogram: a bucket is a float64's exponent and its top SUB_BITS mantissa
# bits, so it spans at most 1/128 of its values and its middle is within 0.4 % of any of them. Values under
# FLOOR_S count as FLOOR_S.
SUB_BITS = 7
FLOOR_S = 1e-6
HIST_METRICS = ("ttft", "tpot", "itl", "e2e", "dispatch_lag")
_SHIFT = 52 - SUB_BITS


def to_buckets(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Histogram of latencies in seconds: (bucket ids, counts). NaNs are ignored. float32 input (the gaps) is
    binned on its own bits, into the same buckets as float64, without a copy to float64."""
    v = np.asarray(values)
    if v.dtype == np.float32:
        bits, shift, offset = np.int32, 23 - SUB_BITS, (1023 - 127) << SUB_BITS  # same exponent, other bias
    else:
        v, bits, shift, offset = v.astype(np.float64, copy=False), np.int64, _SHIFT, 0
    v = v[~np.isnan(v)]
    if v.size == 0:
        return np.empty(0, np.int64), np.empty(0, np.int64)
    floor = int(np.array(FLOOR_S, v.dtype).view(bits) >> shift)
    counts = np.bincount((np.maximum(v, v.dtype.type(FLOOR_S)).view(bits) >> shift) - floor)
    ids = np.nonzero(counts)[0]
    return ids.astype(np.int64) + floor + offset, counts[ids]


def bucket_value(bucket: np.ndarray | int) -> np.ndarray | float:
    """The value a bucket stands for: the middle of its range."""
    b = np.asarray(bucket, dtype=np.int64)
    low = (b << _SHIFT).view(np.float64)
    high = ((b + 1) << _SHIFT).view(np.float64)
    return (low + high) / 2
