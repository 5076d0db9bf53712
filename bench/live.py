"""What a person watches during a run (a rich live panel) and reads after it (the summary table)."""

from __future__ import annotations

import time

import numpy as np
from rich.console import Console
from rich.live import Live as RichLive
from rich.table import Table

from bench.store import queries, runinfo

WINDOW_S = 5.0  # the achieved rate is the rate of the last few seconds


class Live:
    """Elapsed, requests, achieved vs target rate, TTFT p50/p95, errors; refreshed by the run loop. Against a twin
    k times faster than the GPUs it models, rates are divided by k and latencies multiplied by k, as every page and
    report shows a twin run (runinfo.summary), and the title says so: never the twin's own time beside a model's."""

    def __init__(self, enabled: bool, profile, config: dict, collector, env, sent_total):
        self.enabled, self.profile, self.config, self.collector, self.env = enabled, profile, config, collector, env
        c = runinfo.run_config(config)
        self.scale = float(c["time_scale"] or 1.0) if c["twin"] else 1.0
        gpus = f"{c['tp']}x {str(c['gpu']).upper()}" if c["tp"] and c["gpu"] else "the modelled GPUs"
        self.clock = runinfo.clock(self.scale, True, gpus) if c["twin"] else ""
        self.sent_total = sent_total  # requests sent so far (all workers)
        self.errors = 0
        self.ttft: list[float] = []
        self.sent: list[tuple[float, int]] = []  # (time, sent so far) over the last WINDOW_S
        self._live = RichLive(console=Console(stderr=True), auto_refresh=False, transient=False) if enabled else None

    def __enter__(self) -> Live:
        if self._live:
            self._live.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        if self._live:
            self.update()
            self._live.__exit__(*exc)

    def update(self) -> None:
        recent, self.collector.recent = self.collector.recent, []
        for r in recent:
            if r["status"] == "cancelled":  # on purpose (--cancel): neither an error nor a latency
                continue
            if r["status"] != "ok":
                self.errors += 1
            elif r["phase"] == "measured" and r["ttft_s"] is not None:
                self.ttft.append(r["ttft_s"])
        self.ttft = self.ttft[-2000:]
        now = time.time()
        self.sent.append((now, self.sent_total()))
        self.sent = [x for x in self.sent if x[0] > now - WINDOW_S - 1e-3]
        if self._live:
            self._live.update(self.table(now), refresh=True)

    def table(self, now: float) -> Table:
        t0, warmup = self.config["t0"], self.config.get("warmup_s", 0.0)
        elapsed = max(0.0, now - t0)
        (t_a, n_a), (t_b, n_b) = self.sent[0], self.sent[-1]
        k = self.scale
        achieved = (n_b - n_a) / (t_b - t_a) / k if t_b > t_a else 0.0
        if elapsed > self.config.get("duration_s", 0):
            target = "schedule done, draining"
        elif self.profile.open_loop and self.profile.type != "trace":
            target = f"{float(self.profile.rate(np.array([max(0.0, elapsed - warmup)]))[0]) / k:.1f} req/s"
        else:
            target = f"{self.env.runner.user_count} users" if not self.profile.open_loop else "trace"
        p50, p95 = (np.percentile(self.ttft, [50, 95]) * k if self.ttft else (None, None))
        t = Table(title=f"capbench run: {self.profile.name} ({'warm-up' if elapsed < warmup else 'measured'})"
                  + (f"\n{self.clock}" if self.clock else ""), show_header=False)
        t.add_row("elapsed (wall clock)" if self.clock else "elapsed",
                  f"{elapsed:.0f} / {self.config.get('duration_s', 0):.0f} s")
        t.add_row("requests", f"{self.collector.records}")
        t.add_row("achieved vs target", f"{achieved:.1f} req/s sent vs {target}")
        t.add_row("TTFT p50 / p95", "-" if p50 is None else f"{p50 * 1000:.1f} / {p95 * 1000:.1f} ms")
        t.add_row("errors", f"{self.errors}")
        return t


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{v * 1000:.1f} ms"


LAG_WARN_S = 0.010


def behind(s: dict) -> bool:
    """The client fell behind its schedule (dispatch lag p99 over 10 ms), and TTFT from the send is known."""
    lag = s.get("dispatch_lag_p99")
    return lag is not None and lag > LAG_WARN_S and s.get("ttft_from_send_p50") is not None


def summary_table(s: dict) -> Table:
    k = s.get("time_scale") or 1.0
    t = Table(title=f"run {s['run_id']} ({s['status']})" + (f"\n{runinfo.clock(k, True)}" if k != 1 else ""),
              show_header=False)
    rate = s.get("achieved_rate_rps")
    t.add_row("requests (measured / warm-up)", f"{s['measured']} / {s['warmup']}")
    t.add_row("ok / errors", f"{s['ok']} / {s['errors']}"
              + (f"  ({', '.join(f'{k}: {v}' for k, v in s['errors_by_kind'].items())})" if s["errors"] else ""))
    if s.get("cancelled"):
        t.add_row("cancelled by the client", f"{s['cancelled']} (--cancel; not errors, not in the percentiles)")
    t.add_row("achieved send rate", "-" if rate is None else f"{rate:.2f} req/s")
    t.add_row("throughput", "-" if s.get("throughput_rps") is None else
              f"{s['throughput_rps']:.2f} req/s, {s.get('output_tps') or 0:.0f} output tok/s")
    for m in ("ttft", "tpot", "itl", "e2e", "dispatch_lag"):
        t.add_row(f"{m} p50 / p95 / p99", " / ".join(_ms(s.get(f"{m}_p{q}")) for q in (50, 95, 99)))
        if m == "ttft" and behind(s):  # beside TTFT: how much of it is the client's own lateness
            t.add_row("  of which the client was late", f"p50 {_ms(s['ttft_lag_p50'])}: TTFT p50 from the send "
                      f"{_ms(s['ttft_from_send_p50'])} (the client fell behind its schedule)")
    slo = ", ".join(f"{k}<={_ms(s[f'slo_{k}_s'])}" for k in ("ttft", "tpot", "e2e") if s.get(f"slo_{k}_s"))
    if slo:
        att = s.get("slo_attainment")
        t.add_row(f"goodput ({slo})", "-" if s.get("goodput_rps") is None else
                  f"{s['goodput_rps']:.2f} req/s, {att:.1%} of requests meet the SLO")
    return t


def print_summary(s: dict, to_stderr: bool = False, store=None, slo=None) -> None:  # noqa: ANN001
    """The run's summary table; against a twin (given the store), in the modelled GPUs' time as the live panel,
    the dashboard and the reports show it (runinfo.summary), labelled so."""
    if store is not None:
        with store.connect() as con:
            scale = runinfo.time_scale(con, s["run_id"])
            if scale != 1:
                s = {**s, **runinfo.summary(con, s["run_id"], slo)}
                s["by_turn"] = [{**t, **{k: None if t[k] is None else t[k] * scale for k in ("ttft_p50", "ttft_p90")}}
                                for t in s.get("by_turn") or []]
    console = Console(stderr=to_stderr)
    console.print(summary_table(s))
    if "sent" in s:
        lost = s["sent"] - s["stored"]
        console.print(f"requests: {s['sent']} sent, {s['stored']} stored" + (f", {lost} LOST" if lost > 0 else ""))
    if s.get("slot_wait_p50") is not None:
        console.print(f"waited for a slot under the concurrency cap: p50 {_ms(s['slot_wait_p50'])}, p90 "
                      f"{_ms(s['slot_wait_p90'])}, p99 {_ms(s['slot_wait_p99'])} (not in TTFT/E2E, as in "
                      "bench_serving; counted in SLO met)")
    if s.get("ttfc_p50") is not None:
        console.print(f"time to the first answer token (after reasoning): p50 {_ms(s['ttfc_p50'])}, "
                      f"p90 {_ms(s['ttfc_p90'])}, p99 {_ms(s['ttfc_p99'])}")
    if s.get("by_turn"):
        console.print(turn_table(s["by_turn"]))
    if store is not None:
        with store.connect() as con:
            gpus = queries.gpu_summary(con, s["run_id"])
        if len(gpus):
            console.print(gpu_table(gpus))
    lag = s.get("dispatch_lag_p99")
    if lag is not None and lag > LAG_WARN_S:
        console.print(f"note: dispatch lag p99 {lag * 1000:.1f} ms: the client fell behind its schedule (latencies "
                      "count from the due time, so they include it); more --workers or a quieter machine help.")


def gpu_table(gpus) -> Table:  # noqa: ANN001  (queries.gpu_summary's frame)
    """Each GPU's utilisation and memory over the run, per node (NVML here, or a node's DCGM exporter)."""
    t = Table(title="GPUs during the run")
    for col in ("node", "GPU", "name", "samples", "util mean / max", "memory used mean / max", "power"):
        t.add_column(col, justify="left" if col in ("node", "name") else "right")
    for r in gpus.itertuples():
        total = "" if r.mem_total_mib != r.mem_total_mib or r.mem_total_mib is None else \
            f" of {r.mem_total_mib / 1024:.1f}"
        t.add_row(r.node if isinstance(r.node, str) else "this machine (NVML)", str(r.gpu), str(r.name or "-"),
                  str(r.samples), f"{_pct(r.gpu_util_mean)} / {_pct(r.gpu_util_max)}",
                  f"{_gib(r.mem_used_mean_mib)} / {_gib(r.mem_used_max_mib)}{total} GiB",
                  "-" if r.power_w != r.power_w or r.power_w is None else f"{r.power_w:.0f} W")
    return t


def _pct(v: float | None) -> str:
    return "-" if v is None or v != v else f"{v:.0f} %"


def _gib(v: float | None) -> str:
    return "-" if v is None or v != v else f"{v / 1024:.1f}"


def turn_table(turns: list[dict]) -> Table:
    """Closed-loop sessions by turn: TTFT and the prefix cache's share of each turn's prompt."""
    t = Table(title="by turn (closed-loop sessions)")
    for col in ("turn", "requests", "ok", "TTFT p50", "TTFT p90", "prompt tokens", "cached"):
        t.add_column(col, justify="right")
    for r in turns:
        cached = r["cached_share"]
        t.add_row(str(r["turn"]), str(r["requests"]), str(r["ok"]), _ms(r["ttft_p50"]), _ms(r["ttft_p90"]),
                  "-" if r["prompt_tokens_mean"] is None else f"{r['prompt_tokens_mean']:.0f}",
                  "not reported" if cached is None else f"{cached:.0%}")
    return t


def print_sweep(stages: list[tuple[float | None, dict]], min_attainment: float) -> None:
    """One row per sweep stage, and the highest offered rate whose SLO attainment held."""
    t = Table(title="sweep")
    for col in ("stage", "offered req/s", "done req/s", "goodput req/s", "SLO met", "TTFT p50", "E2E p50",
                "errors"):
        t.add_column(col, justify="right")
    best = None
    for k, (offered, s) in enumerate(stages):
        att = s.get("slo_attainment")
        if offered is not None and att is not None and att >= min_attainment and not s.get("saturated"):
            best = offered
        t.add_row(str(k), "1 user" if offered is None else f"{offered:g}",
                  f"{s.get('throughput_rps') or 0:.2f}", f"{s.get('goodput_rps') or 0:.2f}",
                  "-" if att is None else f"{att:.0%}", _ms(s.get("ttft_p50")), _ms(s.get("e2e_p50")),
                  str(s.get("errors", 0)))
    console = Console()
    console.print(t)
    console.print(f"highest offered rate with >= {min_attainment:.0%} of requests within the SLO: "
                  + ("none" if best is None else f"{best:g} req/s"))
