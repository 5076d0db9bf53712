"""What makes a cold plan faster must not move a figure: the prefix cache's C-level block loops keep the per-block
bookkeeping they replaced (refcounts, LRU order, hits), the screen's bursts drawn once are the same requests as a
fresh draw, and a plan searched by a pool of workers has the figures of the serial search."""

from __future__ import annotations

import math
import random
import sys
from collections import OrderedDict
from dataclasses import asdict

import pytest

from bench.model import Question, make_plan, parse_slo, rate
from bench.model.serving import workload
from bench.model.serving.prefix_cache import PrefixCache
from bench.model.serving.workload import load_workload, make_requests


class _PerBlock:
    """The prefix cache as it was written before, one Python step per block: the specification."""

    def __init__(self) -> None:
        self.ref: dict[int, int] = {}
        self.lru: OrderedDict[int, None] = OrderedDict()

    def match(self, keys: list[int]) -> int:
        n = 0
        for key in keys:
            if key not in self.ref:
                break
            n += 1
        return n

    def unheld(self, keys: list[int]) -> int:
        return sum(1 for key in keys if not self.ref[key])

    def hold(self, keys: list[int]) -> None:
        for key in keys:
            count = self.ref.get(key, 0)
            if count == 0 and key in self.lru:
                del self.lru[key]
            self.ref[key] = count + 1

    def add_free(self, keys: list[int]) -> None:
        for key in keys:
            if key not in self.ref:
                self.ref[key] = 0
                self.lru[key] = None

    def unlock(self, keys: list[int]) -> None:
        for key in reversed(keys):
            self.ref[key] -= 1
            if self.ref[key] == 0:
                self.lru[key] = None

    def evict(self, blocks: int) -> None:
        for _ in range(min(blocks, len(self.lru))):
            del self.ref[self.lru.popitem(last=False)[0]]


def test_the_prefix_cache_keeps_the_per_block_bookkeeping():
    rng = random.Random(7)
    fast, slow = PrefixCache(16), _PerBlock()
    held: list[list[int]] = []
    most_evictable = 0
    for _ in range(3000):
        owner = rng.randrange(12) << 24
        keys = list(range(owner, owner + rng.randrange(1, 60)))
        op = rng.random()
        if op < 0.3:
            hit = fast.match(keys)
            assert hit == slow.match(keys)
            assert fast.unheld(keys[:hit]) == slow.unheld(keys[:hit])
            keys = keys[:hit] + [k for k in keys[hit:] if k not in slow.ref]  # a prompt: its hits, then new blocks
            fast.hold(keys)
            slow.hold(keys)
            held.append(keys)
        elif op < 0.65 and held:
            keys = held.pop(rng.randrange(len(held)))
            fast.unlock(keys)
            slow.unlock(keys)
        elif op < 0.85:
            fast.add_free(keys + keys[:3])  # repeated keys are added once
            slow.add_free(keys + keys[:3])
        else:
            n = rng.randrange(40)
            assert fast.evict(n * 16) == min(n, len(slow.lru)) * 16
            slow.evict(n)
        assert dict(fast.ref) == slow.ref
        assert list(fast.lru) == list(slow.lru)  # the eviction order too
        most_evictable = max(most_evictable, len(slow.lru))
    assert most_evictable > 100 and any(v > 1 for v in slow.ref.values())  # shared and evictable blocks were met


def _fresh_draw(wl, rate, n, seed, block, context):
    """The requests as make_requests drew them before draws were kept: one seeded stream, each request's Poisson gap
    (random.expovariate) drawn just before its lengths."""
    rng = random.Random(seed)
    sessions = workload._Sessions(wl, 2 + int(wl.options.get("groups", 8)))
    t, out = 0.0, []
    for i in range(n):
        if 0 < rate < math.inf:
            t += rng.expovariate(rate)
        runs, prompt, answer = workload._prompt(wl, i, rng, sessions, None)
        prompt = min(prompt, context - 1)
        answer = max(1, min(answer, context - prompt))
        keys = workload._keys(runs + [(prompt + answer, None)], block)
        out.append((str(i), prompt, answer, t, list(keys(prompt)), list(keys(prompt + answer))))
    return out


def _as_drawn(reqs):
    return [(r.rid, r.prompt_len, r.max_new, r.arrival, list(r.prompt_keys), list(r.seq_keys(r.prompt_len + r.max_new)))
            for r in reqs]


def test_a_draw_is_kept_and_each_run_gets_fresh_requests_the_same_as_a_fresh_draw(monkeypatch):
    monkeypatch.setattr(workload, "_streams", {})
    wl = load_workload("agentic-coding")
    first = make_requests(wl, math.inf, 80, 0, 32, 200_000)
    first[0].state, first[0].arrival = "done", 9.0  # what a simulation does to its requests
    second = make_requests(wl, math.inf, 80, 0, 32, 200_000)
    assert len(workload._streams) == 1 and second[0] is not first[0]
    assert second[0].state == "new" and second[0].arrival == 0.0
    assert _as_drawn(second) == _fresh_draw(wl, math.inf, 80, 0, 32, 200_000)
    assert any(r.prompt_keys for r in second)  # sessions share blocks: the keys are compared, not empty lists
    # a rate search: rates up and down, more requests at the longer horizons, one stream, each bit for bit a fresh draw
    for per_s, n in ((2.0, 80), (0.7, 40), (3.1, 200), (2.0, 120)):
        assert _as_drawn(make_requests(wl, per_s, n, 0, 32, 200_000)) == _fresh_draw(wl, per_s, n, 0, 32, 200_000)
    assert len(workload._streams) == 2  # the burst's and the paced one
    for context in range(100_000, 100_000 + 2 * workload.STREAMS_KEPT):  # a Planner asks on and on: memory bounded
        make_requests(wl, math.inf, 80, 0, 32, context)
    assert len(workload._streams) == workload.STREAMS_KEPT


@pytest.mark.slow
def test_a_plan_searched_by_a_pool_has_the_serial_figures(tmp_path, monkeypatch):
    q = Question(model="glm-4.6", gpu="h200", tp=8, workload="chat", target_rate_rps=6.0,
                 slo=parse_slo("ttft=2s,tpot=50ms,p=90"), search_gpus=("h200",))
    plans = []
    for workers in (1, 2):
        monkeypatch.setenv("CAPBENCH_CACHE", str(tmp_path / str(workers)))
        monkeypatch.setenv("CAPBENCH_SHIPPED_CACHE", "0")
        monkeypatch.setattr(rate, "_memory", {})
        plans.append(make_plan(q, workers=workers, curves=workers > 1))
        if workers == 1:
            serial_curves = plans[0].curves()

    def figures(plan):
        return [(str(o.config), o.saturation_tps, o.prediction and asdict(o.prediction), o.rejected_because,
                 o.recommended) for o in plan.options]

    serial, pooled = map(figures, plans)
    assert serial == pooled
    assert plans[0].recommended is not None and sum(o.simulated for o in plans[0].options) >= 3

    def not_here(*_, **__):
        raise AssertionError("a curve point was simulated after the search: the workers were to draw it")

    monkeypatch.setattr(rate.simulate, "run", not_here)
    assert plans[1].curves() == serial_curves and len(serial_curves["points"]) >= 3


def test_backends_priced_alike_share_an_answer_and_others_do_not():
    """The rate cache's key holds what the attention backend changes in the step times (its kernel table's
    source, else the roofline): Kimi's MLA on B200 has no flashinfer or triton table, so the plan's two backend
    variants are one simulation; trtllm_mla has its own table and its own answer."""
    from bench.model.advice.option import Config
    from bench.model.step.calibration import load_efficiency

    q = Question(model="kimi-k2-thinking", workload="chat")
    wl, slo = q.request_mix(), parse_slo("ttft=2s,tpot=50ms")

    def key(attention):
        dep = Config("b200", 4, 1, 4, "fp8_e4m3", "native", attention).deployment(q.model, None)
        return rate._key(dep, wl, slo, load_efficiency("b200"))

    assert key("flashinfer") == key("triton")
    assert key("trtllm_mla") != key("triton")
    dep = Config("b200", 4, 1, 4, "fp8_e4m3", "native", "trtllm_mla").deployment(q.model, None)
    assert rate._key(dep, wl, slo, load_efficiency("b200")) == key(None)  # None: the launch line's trtllm_mla


def test_the_step_memos_do_not_move_a_simulated_figure(monkeypatch):
    """A simulation with the step-time memos (a decode step priced once, a step's GEMM/MoE/all-reduce seconds by
    its token counts, an attention surface's weights by batch size) against one that forgets them before every
    step: the same point, to the last bit, for MLA with DP attention and GQA."""
    from bench.model.advice.option import Config
    from bench.model.serving import simulate
    from bench.model.step import kernels, perfmodel

    cases = (("kimi-k2-thinking", "agentic-coding", Config("b200", 8, 8, 8, "fp8_e4m3", "nvfp4"), 2.0),
             ("glm-4.6", "chat", Config("h200", 8, 1, 1, "fp8_e4m3", "native"), 12.0))
    runs = []
    for forget in (False, True):
        if forget:
            step_time = perfmodel.PerfModel.step_time

            def forgetful(self, *a, step_time=step_time, **k):
                self._last_decode = (None, 0.0)
                if self.kstep is not None:
                    self.kstep._rest.clear()
                return step_time(self, *a, **k)

            monkeypatch.setattr(perfmodel.PerfModel, "step_time", forgetful)
            monkeypatch.setattr(kernels.Surface, "__post_init__", _no_batch_memo)
            kernels._attention.cache_clear()  # the surfaces are made again, without the memo
            kernels._attention_series.cache_clear()
        for model, wl, cfg, rps in cases:
            dep = cfg.deployment(model, None)
            runs.append(asdict(simulate.run(dep, load_workload(wl), rps, 150, min_seconds=60)))
    glm = cases[1][2].deployment("glm-4.6", None)
    forgot = kernels.attention_surface(glm.model, "h200", glm.attention, "fp8_e4m3", "decode", 8)
    assert forgot is not None and isinstance(forgot[0]._at, _Forgets)  # the second pass ran without the memo
    kernels._attention.cache_clear()
    kernels._attention_series.cache_clear()
    assert runs[:2] == runs[2:]
    assert all(r["output_tok_s"] > 0 for r in runs)


def _no_batch_memo(self) -> None:
    object.__setattr__(self, "la", [math.log(x) for x in self.a])
    object.__setattr__(self, "_at", _Forgets())


class _Forgets(dict):
    def __setitem__(self, key, value) -> None:
        pass  # every call looks its batch size up again


def test_threads_drawing_one_stream_at_once_each_get_a_fresh_draws_requests(monkeypatch):
    """The dashboard's sessions are threads of one process: two plans extending one kept draw at once must not
    interleave their draws (each would get requests no fresh draw makes)."""
    from concurrent.futures import ThreadPoolExecutor

    monkeypatch.setattr(workload, "_streams", {})
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads as often as the interpreter allows
    try:
        wl = load_workload("agentic-coding")
        sizes = [40 * (i + 1) for i in range(12)]
        with ThreadPoolExecutor(6) as pool:
            got = list(pool.map(lambda n: _as_drawn(make_requests(wl, 2.0, n, 0, 32, 200_000)), sizes))
    finally:
        sys.setswitchinterval(interval)
    want = _fresh_draw(wl, 2.0, max(sizes), 0, 32, 200_000)
    assert all(g == want[:n] for g, n in zip(got, sizes, strict=True))


def test_a_fork_starts_without_the_parents_draws_or_its_lock(monkeypatch):
    """The plan's workers are forks: one made while another thread draws must neither wait on the copied lock nor
    resume a stream copied half drawn."""
    import os

    monkeypatch.setattr(workload, "_streams", {})
    wl = load_workload("agentic-coding")
    make_requests(wl, 2.0, 40, 0, 32, 200_000)
    with workload._drawing:  # held, as another thread would hold it
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                if not workload._streams and workload._drawing.acquire(timeout=5):
                    workload._drawing.release()
                    fresh = _fresh_draw(wl, 2.0, 60, 0, 32, 200_000)
                    code = 0 if _as_drawn(make_requests(wl, 2.0, 60, 0, 32, 200_000)) == fresh else 1
            finally:
                os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert len(workload._streams) == 1  # the parent keeps its own
