"""Judging one stage of a campaign's sweep: every request the stage sent is judged, none is dropped.

When the stage's sending ends, the requests still running are waited for up to the SLO's bound for a full answer
(drain_s); any that then lack a first token or a full answer were cut off, and each counts as an SLO miss: in the
share within the SLO, and in the percentiles (a latency past any bound). Requests that failed otherwise (HTTP
errors, timeouts) are errors: more than RUN_ERRORS_OK of them and the stage misses the SLO whatever its latencies.
A stage states sent / completed / missed / errored wherever its figures appear (stage_counts is the one wording).
Behind a concurrency cap, a request's wait in the client for a slot (slot_wait_s) counts in its TTFT and E2E here:
its user waited, as the model's capped predictions count it (bench.model.serving.rate.within_slo).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np

from bench.model import Slo, StageSample, stage_sample
from bench.store import Store

RUN_ERRORS_OK = 0.01  # a stage with a larger share of failed requests misses the SLO
FLUSH_WAIT_S = 30.0  # how long a stage waits for the server to go idle and empty its prefix cache
FAR = 1e9  # the latency counted for a request the stage's end cut off: past any bound
CUT_OFF_KINDS = ("aborted", "cancelled")  # a request the run's end stopped (loadgen says cancelled)
COUNTS = ("sent", "completed", "within_slo", "missed", "cut_off", "errored")


@dataclass
class Stage:
    rate: float  # offered, requests/s of the deployment's GPUs
    run_id: str
    summary: dict
    meets: bool
    why: str  # what missed, or ""
    sample: StageSample | None = None  # its requests, for the bootstrap (bench/model/evidence/bootstrap.py)
    sure: bool = True  # its verdict stands in nearly every bootstrap draw (bootstrap.SURE); the sweep anchors on it

    @property
    def goodput(self) -> float:
        """Requests/s within the SLO: the offered rate times the share of requests that met it (a short stage's
        finished-per-second still counts the ramp, so it would stop rising before the server does)."""
        return self.rate * (self.summary.get("slo_attainment") or 0.0)


def window_output_tps(summary: dict, window_s: float) -> float:
    """The output tokens/s a stage sustained: the answers of its measured requests (those sent in its window that
    completed, the drain included) per second of the window they were sent in. At a load the deployment keeps up
    with this is the offered rate times the mean answer, whatever the stage's length; the summary's own output_tps
    divides by the span up to the last answer, which in a stage shorter than an answer's latency is mostly drain."""
    return (summary.get("output_tokens") or 0.0) / window_s if window_s > 0 else 0.0


def drain_s(slo: Slo, longest_answer: int | None) -> float | None:
    """How long the stage waits, after its last arrival, for the requests still running: the SLO's bound for a
    full answer (e2e, or TTFT plus TPOT for each token of the workload's longest answer); None: no bound."""
    if slo.e2e_s is not None:
        return slo.e2e_s
    if slo.ttft_s is None:
        return None
    return slo.ttft_s + (slo.tpot_s or 0.0) * (longest_answer or 0)


def judge(store: Store, run_id: str, slo: Slo) -> dict:
    """The stage's counts (COUNTS), its share within the SLO and its TTFT / TPOT / E2E percentiles over every request
    it sent except the errored ones, a cut-off request counting as past every bound."""
    cut = ", ".join("?" * len(CUT_OFF_KINDS))
    is_cut = f"(status <> 'ok' AND coalesce(error_kind, '') IN ({cut}))"
    bounds = (slo.ttft_s or FAR, slo.tpot_s or FAR, slo.e2e_s or FAR)
    q = slo.percentile / 100
    ttft, e2e = "(ttft_s + coalesce(slot_wait_s, 0))", "(e2e_s + coalesce(slot_wait_s, 0))"
    with store.connect() as con:
        row = con.execute(
            f"SELECT count(*), count(*) FILTER (WHERE status = 'ok'), "
            f"count(*) FILTER (WHERE status = 'ok' AND {ttft} <= ? AND coalesce(tpot_s, 0) <= ? AND {e2e} <= ?), "
            f"count(*) FILTER (WHERE {is_cut}), "
            f"quantile_disc(CASE WHEN {is_cut} AND first_token_at IS NULL THEN ? ELSE {ttft} END, ?) "
            f"FILTER (WHERE status = 'ok' OR {is_cut}), "
            f"quantile_disc(CASE WHEN {is_cut} THEN ? ELSE tpot_s END, ?) FILTER (WHERE status = 'ok' OR {is_cut}), "
            f"quantile_disc(CASE WHEN {is_cut} THEN ? ELSE {e2e} END, ?) FILTER (WHERE status = 'ok' OR {is_cut}) "
            "FROM requests WHERE run_id = ? AND phase = 'measured'",
            [*bounds, *CUT_OFF_KINDS, *CUT_OFF_KINDS, FAR, q, *CUT_OFF_KINDS, *CUT_OFF_KINDS, FAR, q,
             *CUT_OFF_KINDS, *CUT_OFF_KINDS, FAR, q, *CUT_OFF_KINDS, run_id]).fetchone()
    sent, completed, within, cut_off, ttft, tpot, e2e = row
    errored = sent - completed - cut_off
    judged = sent - errored
    out = {"sent": sent, "completed": completed, "within_slo": within, "missed": judged - within,
           "cut_off": cut_off, "errored": errored, "failed": errored,
           "slo_attainment": within / judged if judged else 0.0}
    p = slo.percentile
    for name, value in (("ttft", ttft), ("tpot", tpot), ("e2e", e2e)):
        out[f"{name}_p{p}"] = value
    return out


def requests_sample(store: Store, run_id: str, slo: Slo, rate: float, output_tps: float, seed: int | None = None
                    ) -> StageSample:
    """The stage's requests as judge() counts them, for the bootstrap over requests. seed: the seed of its prompts
    when stages share them (a nested profile: measured request j is the workload's j in each), so that the bootstrap
    resamples the same requests in each such stage; None: its requests are its own."""
    cut = ", ".join("?" * len(CUT_OFF_KINDS))
    with store.connect() as con:
        rows = con.execute(
            f"SELECT status = 'ok', status <> 'ok' AND coalesce(error_kind, '') IN ({cut}), ttft_s, "
            "coalesce(tpot_s, 0), e2e_s, coalesce(completion_tokens, 0), TRY_CAST(request_id AS BIGINT) "
            "FROM requests WHERE run_id = ? AND phase = 'measured'", [*CUT_OFF_KINDS, run_id]).fetchall()
    a = np.array(rows, dtype=float).reshape(-1, 7)
    index = None
    if seed is not None and len(a) and not np.isnan(a[:, 6]).any():
        index = (a[:, 6] - a[:, 6].min()).astype(np.int64)  # the measured ones follow the warm-up's
    return stage_sample(rate, a[:, 0] > 0, a[:, 1] > 0, a[:, 2:5], (slo.ttft_s, slo.tpot_s, slo.e2e_s), a[:, 5],
                        output_tps, index, seed)


def meets(summary: dict, slo: Slo, scale: float = 1.0) -> tuple[bool, str]:
    """The stage's p-th percentiles within the SLO's bounds, and nearly every request served; the reason it misses
    in the modelled GPUs' time (a twin `scale` times faster: its latencies x scale), like the rates beside it."""
    if not summary.get("sent"):
        return False, "no request measured"
    errored = summary.get("errored", 0) / summary["sent"]
    if errored > RUN_ERRORS_OK:
        return False, f"{errored:.0%} of requests failed"
    q = slo.percentile
    for name, bound in (("ttft", slo.ttft_s), ("tpot", slo.tpot_s), ("e2e", slo.e2e_s)):
        value = summary.get(f"{name}_p{q}")
        if bound is not None and value is not None and value > bound:
            if value >= FAR:
                return False, f"over {100 - q} % of requests were cut off without a {_what(name)} by the stage's end"
            return False, f"{name.upper()} p{q} {value * scale:.3g} s > {bound * scale:.3g} s"
    return True, ""


def _what(metric: str) -> str:
    return "first token" if metric == "ttft" else "full answer"


def twin_behind_s(url: str) -> float | None:
    """Wall seconds a twin's scheduler loop has fallen behind its modelled pace and not made up (its host's CPU
    could not keep up); None for a server that is not a twin or does not answer."""
    import httpx

    from bench import http

    try:
        return float(http.get(url.rstrip("/") + "/get_server_info", timeout=5).json()["capbench"]["behind_s"])
    except (httpx.HTTPError, ValueError, KeyError, TypeError):
        return None


def flush_cache(url: str, api_key_env: str | None = None) -> bool:
    """Empty the server's prefix cache (SGLang's /flush_cache, which the twin and the PD router also serve) so that a
    stage can resend the stage before's prompts and find none of them cached; False when it would not. SGLang
    flushes only when idle: `timeout` lets the stage before's cut-off requests leave first (0.5.23 waits up to it;
    an older SGLang ignores it and refuses while any run)."""
    import httpx

    from bench import http

    secret = os.environ.get(api_key_env, "") if api_key_env else ""
    try:
        r = http.post(url.rstrip("/") + "/flush_cache", params={"timeout": FLUSH_WAIT_S}, timeout=FLUSH_WAIT_S + 10,
                      headers={"Authorization": f"Bearer {secret}"} if secret else None)
        return r.status_code == 200
    except httpx.HTTPError:
        return False


def stage_counts(summary: dict) -> str:
    """sent / completed / missed / errored, as every place that shows a stage says it."""
    if "sent" not in summary:
        return "-"
    cut = f" ({summary['cut_off']} cut off)" if summary.get("cut_off") else ""
    return (f"{summary['sent']} sent, {summary['completed']} completed, {summary['missed']} missed the SLO{cut}, "
            f"{summary['errored']} errored")


def shown(value: float | None, scale: float = 1.0) -> float | None:
    """A percentile as reports show it: None for one past every bound (cut off), else in the modelled time."""
    return None if value is None or value >= FAR else value * scale


def longest_answer(workload: str) -> int | None:
    """The workload's longest answer in tokens (its output lengths' max, or fixed value), None if it has none."""
    from bench.model import load_workload

    wl = load_workload(workload)
    out = getattr(wl, "output", None)
    params = getattr(out, "params", None) or {}
    if wl.type == "sharegpt":
        return int((getattr(wl, "options", None) or {}).get("max_output_tokens", 2048))
    value = params.get("max", params.get("value"))
    return int(value) if value else None
