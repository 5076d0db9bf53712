"""The disaggregated twin (bench/twin/pd.py) over HTTP: its prefill queue, the KV transfer and its decode queue
measured against what the PD model predicts at an idle server, and beside a colocated twin on the same GPUs."""

import statistics
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from bench.errors import BadInput
from bench.model import interconnect
from bench.model.pd import disagg
from bench.twin import TwinConfig, parse_twin_spec, serve_in_thread
from bench.twin.pd import PDTwin
from bench.twin.server import TwinRequest

SCALE = 0.5  # half real speed: the twin's own Python overhead (HTTP, tokenizing) stays small beside its steps
PD = dict(model="kimi-k2-thinking", gpu="h200", tp=8, dp=8, kv_dtype="fp8_e4m3", time_scale=SCALE)


def ask(url: str, i: int, prompt_words: int, output: int) -> dict:
    """One non-streamed completion; its server-side timings in modelled seconds."""
    r = httpx.post(url + "/v1/completions", json={"model": "x", "prompt": f"request {i} " + "word " * prompt_words,
                                                  "max_tokens": output, "ignore_eos": True, "temperature": 0},
                   timeout=120)
    assert r.status_code == 200, r.text
    h = r.headers
    arrival, first, finish = (float(h[k]) for k in ("X-Capbench-Arrival", "X-Capbench-First-Token",
                                                    "X-Capbench-Finish"))
    usage = r.json()["usage"]
    return {"ttft": (first - arrival) * SCALE, "tpot": (finish - first) * SCALE / (usage["completion_tokens"] - 1),
            "prompt": usage["prompt_tokens"], "output": usage["completion_tokens"]}


def test_the_spec_names_a_disaggregated_twin_and_refuses_a_bad_one():
    c = parse_twin_spec("twin:kimi-k2-thinking@h200x8,dp=8,prefill_tp=8,kv_dtype=fp8_e4m3")
    assert c.prefill_tp == 8
    with pytest.raises(BadInput):
        parse_twin_spec("twin:kimi-k2-thinking@h200x8,prefill_tp=-8")


def test_an_idle_pd_twin_measures_what_the_pd_model_predicts():
    with serve_in_thread(TwinConfig(**PD, prefill_tp=8)) as h:
        runs = [ask(h.url, i, 12000, 24) for i in range(3)]
        info = httpx.get(h.url + "/server_info").json()
    assert info["disaggregation"]["kv_transfers"] == 3
    shape = disagg.Shape("kimi-k2-thinking", "h200", 8, 8, "fp8_e4m3")
    prompt = runs[0]["prompt"]
    ln = disagg.Lengths(prompt, 0, 24, prompt + 24)
    prefill = disagg.PDPerfModel(shape, "prefill")
    decode = disagg.PDPerfModel(shape, "decode")
    transfer = interconnect.kv_transfer_s(prefill.dep.gpu, disagg.kv_bytes(shape, prompt))
    router = interconnect.assumptions()["router_ms"] * 1e-3
    step = decode.step_time(1, prompt + 12)
    pairs = prompt * (ln.new + 1) / 2  # a lone request prefills on one DP-attention group of the prefill instance
    predicted_ttft = prefill.step_time(0, 0, prompt, pairs, prompt, busiest=(prompt, pairs)) + transfer + router + \
        decode.step_time(0, 0, prompt)  # the decode instance takes the request in (no extend) and sends token 1
    measured_ttft = statistics.median(r["ttft"] for r in runs)
    measured_tpot = statistics.median(r["tpot"] for r in runs)
    assert measured_ttft == pytest.approx(predicted_ttft, rel=0.35), (measured_ttft, predicted_ttft)
    assert measured_tpot == pytest.approx(step, rel=0.35), (measured_tpot, step)
    assert measured_ttft > transfer  # the transfer is inside the TTFT


def test_under_a_prefill_heavy_burst_pd_keeps_decode_steps_clean_and_colocated_does_not():
    """Same 8 GPUs of decode, long prompts arriving while others decode: the colocated twin's decode steps wait
    behind prefill chunks (TPOT grows), the PD twin's decode instance never prefills."""
    def burst(config: TwinConfig) -> float:
        with serve_in_thread(config) as h, ThreadPoolExecutor(12) as pool:
            runs = list(pool.map(lambda i: ask(h.url, i, 6000, 48), range(12)))
        return statistics.median(r["tpot"] for r in runs)

    colocated = burst(TwinConfig(**PD))
    pd = burst(TwinConfig(**PD, prefill_tp=8))
    assert pd < colocated, (pd, colocated)


def test_a_flush_empties_both_instances_prefix_caches():
    """A campaign empties the cache before each stage (common requests): on a PD twin that is the prefill instance's
    cache too, or a resent prompt would skip its prefill."""
    def cached(url: str) -> int:
        r = httpx.post(url + "/v1/completions", json={"model": "x", "prompt": "the same prompt " + "word " * 3000,
                                                      "max_tokens": 2, "ignore_eos": True}, timeout=60)
        assert r.status_code == 200, r.text
        return (r.json()["usage"].get("prompt_tokens_details") or {}).get("cached_tokens") or 0

    with serve_in_thread(TwinConfig(**{**PD, "time_scale": 50.0}, prefill_tp=8)) as h:
        first, again = cached(h.url), cached(h.url)
        assert httpx.post(h.url + "/flush_cache", timeout=10).status_code == 200
        flushed = cached(h.url)
    assert first == 0 and again > 2000 and flushed == 0, (first, again, flushed)


def test_a_client_that_leaves_during_prefill_is_aborted_on_both_instances():
    """SGLang's router aborts a request on both instances when its client leaves: the twin's prefill instance drops
    it, its KV never crosses and the decode instance never decodes it, so a campaign's flush finds the twin idle at
    once instead of waiting for an orphan to decode to its end."""
    with serve_in_thread(TwinConfig(**{**PD, "time_scale": 0.05}, prefill_tp=8)) as h, \
            httpx.Client(base_url=h.url, timeout=30) as http:
        body = {"model": "m", "prompt": "word " * 30000, "max_tokens": 2000, "ignore_eos": True, "stream": True}

        def leave() -> None:  # the stream's headers come with its first token, long after this client gave up
            with pytest.raises(httpx.ReadTimeout):
                httpx.post(h.url + "/v1/completions", json=body, timeout=1.0)

        with ThreadPoolExecutor(1) as pool:
            left = pool.submit(leave)
            time.sleep(0.5)
            assert http.post("/flush_cache").status_code == 400  # in prefill: not idle
            left.result()
        t = time.monotonic()
        assert http.post("/flush_cache", params={"timeout": 10}).status_code == 200
        assert time.monotonic() - t < 1.0
        time.sleep(0.2)
        assert http.get("/get_server_info").json()["disaggregation"]["kv_transfers"] == 0


def test_a_request_aborted_while_its_kv_crosses_never_reaches_the_decode_instance():
    twin = PDTwin(TwinConfig(**PD, prefill_tp=8))
    req = TwinRequest(rid="r", prompt_len=64, max_new=8, arrival=0.0, prompt_keys=[1, 2, 3, 4])
    twin.crossing.add(req)
    assert not twin.idle()
    twin.abort(req)
    twin._arrive(req)  # the transfer's timer fires after the abort
    assert twin.idle() and twin.transfers == 0 and not twin.sched.inbox and not twin.sched.waiting
    assert req.state == "aborted"
