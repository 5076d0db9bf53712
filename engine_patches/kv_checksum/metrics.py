"""Prometheus counters for KV page checksums, as they appear on SGLang's /metrics.

SGLang serves /metrics (with --enable-metrics) from prometheus_client's multiprocess collector: every process
writes its values under PROMETHEUS_MULTIPROC_DIR, which the launcher sets before it spawns the schedulers.
prometheus_client picks its value store when it is first imported, so the counters are created lazily, in the
scheduler process, when the checksummed radix cache is built: never at import time.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache


@dataclass(frozen=True)
class KVChecksumMetrics:
    pages_checksummed: object
    pages_verified: object
    mismatches: object
    seconds: object
    verifications: object
    record_damage: object
    flag_damage: object


@cache
def kv_checksum_metrics() -> KVChecksumMetrics:
    from prometheus_client import Counter

    # prometheus_client appends _total to counter names.
    return KVChecksumMetrics(
        pages_checksummed=Counter(
            "capbench_kv_pages_checksummed", "KV pages sealed (checksummed when they filled, or at their first check)"
        ),
        pages_verified=Counter("capbench_kv_pages_verified", "KV pages compared with their seals"),
        mismatches=Counter("capbench_kv_checksum_mismatch", "KV pages whose checksum did not match", ["source"]),
        seconds=Counter("capbench_kv_checksum_seconds", "Host seconds spent computing and comparing KV checksums"),
        verifications=Counter(
            "capbench_kv_verifications",
            "Batched KV page checks (one kernel launch and one host read-back on a GPU) by where they ran: "
            "admission, insert, scrub, offload, load",
            ["source"],
        ),
        record_damage=Counter(
            "capbench_kv_checksum_record_damage",
            "Checksum records found damaged while the KV bytes were intact (seal: repaired; rows: dropped)",
            ["record"],
        ),
        flag_damage=Counter(
            "capbench_kv_checksum_flag_damage", "Page state bytes (sealed / bad / pending) found damaged"
        ),
    )
