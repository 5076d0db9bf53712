"""The twin's /metrics: SGLang's metric names in Prometheus text format (version 0.0.4).

Written by hand rather than with prometheus_client: the scheduler observes inter-token latency for every running
request on every step, and a plain list of bucket counts costs a fraction of a client library's locked observe.
Names, types and buckets follow SGLang 0.5.23 (`--enable-metrics`); every series has the label model_name.
"""

from __future__ import annotations

from bisect import bisect_left

TTFT_BUCKETS = (0.1, 0.2, 0.4, 0.6, 0.8, 1.0, 2.0, 4.0, 6.0, 8.0, 10.0, 20.0, 40.0, 60.0, 80.0, 100.0, 200.0, 400.0)
ITL_BUCKETS = (0.002, 0.004, 0.006, 0.008, 0.010, 0.015, 0.020, 0.025, 0.030, 0.035, 0.040, 0.060, 0.080, 0.100,
               0.200, 0.400, 0.600, 0.800, 1.0, 2.0, 4.0, 6.0, 8.0)
E2E_BUCKETS = (0.1, 0.2, 0.4, 0.6, 0.8, 1.0, 2.0, 4.0, 6.0, 8.0, 10.0, 20.0, 40.0, 60.0, 80.0, 100.0, 200.0, 400.0,
               600.0, 1200.0, 1800.0, 2400.0)


class Histogram:
    def __init__(self, name: str, doc: str, buckets: tuple[float, ...]) -> None:
        self.name, self.doc, self.buckets = name, doc, buckets
        self.counts = [0] * (len(buckets) + 1)
        self.sum = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self.buckets, value)] += 1
        self.sum += value

    def render(self, labels: str) -> list[str]:
        lines = [f"# HELP {self.name} {self.doc}", f"# TYPE {self.name} histogram"]
        total = 0
        for bound, count in zip(self.buckets, self.counts, strict=False):
            total += count
            lines.append(f'{self.name}_bucket{{{labels},le="{bound}"}} {total}')
        total += self.counts[-1]
        lines += [f'{self.name}_bucket{{{labels},le="+Inf"}} {total}', f"{self.name}_sum{{{labels}}} {self.sum}",
                  f"{self.name}_count{{{labels}}} {total}"]
        return lines


class Metrics:
    def __init__(self, model_name: str) -> None:
        self.labels = f'model_name="{model_name}"'
        self.ttft = Histogram("sglang:time_to_first_token_seconds", "Histogram of time to first token in seconds.",
                              TTFT_BUCKETS)
        self.itl = Histogram("sglang:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.",
                             ITL_BUCKETS)
        self.e2e = Histogram("sglang:e2e_request_latency_seconds", "Histogram of End-to-end request latency "
                             "in seconds", E2E_BUCKETS)
        self.requests_total = 0

    def render(self, gauges: dict[str, tuple[str, float]], counters: dict[str, tuple[str, float]]) -> str:
        lines: list[str] = []
        for name, (doc, value) in gauges.items():
            lines += [f"# HELP {name} {doc}", f"# TYPE {name} gauge", f"{name}{{{self.labels}}} {value}"]
        for name, (doc, value) in counters.items():  # named as prometheus_client names counters
            total = f"{name}_total"
            lines += [f"# HELP {total} {doc}", f"# TYPE {total} counter", f"{total}{{{self.labels}}} {value}"]
        for h in (self.ttft, self.itl, self.e2e):
            lines += h.render(self.labels)
        return "\n".join(lines) + "\n"
