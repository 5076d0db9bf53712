"""Pages damaged before they fill, and damaged checksum records, through SGLang's real serving path on CPU
(tests/engine_patches/kv_server.py: its pools, allocator, unified tree, scheduler batches, HiCache controller).

A request r is served; one written row of a page that is not yet full is damaged: the prompt's last page right
after prefill, or the page r is decoding into. The stand-in model's attention reads the damage (Server(derive)), so
everything r computes afterwards is wrong. A later request q asks for r's whole sequence: it must be handed nothing
computed over the damage (the oracle compares what q is handed with the KV of its tokens). Pages 16 and 64, MHA bf16
and MLA fp8, with and without HiCache (write-through, device copies evicted before q so q loads from host).

Run with -s for the trial counts.
"""

from __future__ import annotations

import os
import random
from dataclasses import dataclass

import pytest
import torch
from prometheus_client import REGISTRY
from sglang.srt.mem_cache.base_prefix_cache import EvictParams

from engine_patches.kv_checksum.checksum import pool_buffers
from engine_patches.kv_checksum.events import read_events
from engine_patches.kv_checksum.seals import SEALED
from tests.engine_patches.kv_server import Geometry, Server, flip_page

CONFIGS = [(kind, page, hicache) for kind in ("mha", "mla") for page in (16, 64) for hicache in (False, True)]
TRIALS = 6  # per configuration, plus as many clean controls


def events_of(s: Server) -> list[dict]:
    return read_events(s.log) if os.path.exists(s.log) else []


def metric(name: str, **labels) -> float:
    return REGISTRY.get_sample_value(name, labels or None) or 0.0


def geometry(kind: str, page: int) -> Geometry:
    return Geometry(kind, "fp8" if kind == "mla" else "bf16", page_size=page, pages=48 if page == 16 else 14)


def server(kind: str, page: int, hicache: bool, log: str) -> Server:
    args = {}
    if hicache:
        args = {"enable_hierarchical_cache": True, "hicache_ratio": 2.0, "hicache_io_backend": "direct",
                "hicache_mem_layout": "layer_first", "hicache_write_policy": "write_through"}
    return Server(geometry(kind, page), hicache=hicache, derive=True, server_args=args, log=log)


def run(s: Server) -> None:
    for _ in range(5000):
        if s.idle():
            if s.hicache:
                s.tree.check_hicache_events()
            s.check_slots()
            return
        s.step()
    raise AssertionError("requests did not finish")


def clear_device(s: Server) -> None:
    """Evict every unlocked device copy (with HiCache, backed-up nodes become host-only: q loads them back)."""
    if s.hicache:
        s.tree.check_hicache_events()
    s.tree.evict(EvictParams(num_tokens=1 << 30))
    s.check_slots()


def damage_row(s: Server, req, position: int, rng: random.Random) -> int:
    """Flip one bit of the row of `position` (already written) in a random buffer; returns the page."""
    P = s.g.page_size
    page = s.page_of(req, position)
    buf = rng.choice(pool_buffers(s.pool))
    row_bytes = buf[0].numel() * buf.element_size()
    flip_page(buf, page, P, (position % P) * row_bytes + rng.randrange(row_bytes), rng.randrange(8))
    return page


@dataclass
class Tally:
    trials: int = 0
    prompt_tail: int = 0  # damage in the prompt's last page right after prefill
    decode_page: int = 0  # damage in the page being decoded into
    detected: int = 0  # trials whose damage was logged as a mismatch found at the page's fill
    served_pages: int = 0
    served_corrupt: int = 0
    controls: int = 0  # undamaged trials: q must get r's whole cached sequence, with no mismatch


def trial(s: Server, rng: random.Random, tally: Tally, damage: bool) -> None:
    P = s.g.page_size
    n = rng.randrange(2 * P, 3 * P)  # r's prompt ends inside its third page (or at its start)
    prompt = [rng.randrange(1, 40_000) for _ in range(n)]
    out = [rng.randrange(1, 40_000) for _ in range(2 * P + rng.randrange(2, P))]  # the damaged page fills
    r = s.submit(f"r{tally.trials}{damage}", prompt, out)
    events = len(events_of(s))
    s.step()  # r's prefill
    if damage:
        if n % P and rng.random() < 0.5:
            at, kind = rng.randrange(n - n % P, n), "prompt_tail"
        else:
            steps = rng.choice([k for k in range(1, P) if (n + k) % P])  # leaves the decode page partial
            for _ in range(steps):
                s.step()
            written = n + steps  # a decode step writes the KV of the token sampled before it
            at, kind = rng.randrange(written - written % P, written), "decode_page"
        setattr(tally, kind, getattr(tally, kind) + 1)
        damage_row(s, r, at, rng)
    run(s)
    assert r.finished()
    if s.hicache:
        clear_device(s)  # q loads r's sequence back from host
    q = s.submit(f"q{tally.trials}{damage}", prompt + out + [7], [8])
    before = (s.served.pages, s.served.corrupt)
    run(s)
    tally.served_pages += s.served.pages - before[0]
    tally.served_corrupt += s.served.corrupt - before[1]
    assert s.served.corrupt == 0, "a page computed over a damaged row was served"
    found = [e for e in events_of(s)[events:] if e["kind"] == "kv_checksum_mismatch"]
    if damage:
        tally.trials += 1
        assert q.admitted_prefix <= at // P * P  # nothing at or after the damaged page
        if any(e["detail"]["part"] == "rows" for e in found):
            tally.detected += 1
    else:
        tally.controls += 1
        assert not found and q.admitted_prefix == (n + len(out) - 1) // P * P  # r's whole sequence, cached
    clear_device(s)


@pytest.mark.parametrize("kind,page,hicache", CONFIGS,
                         ids=[f"{k}-p{p}{'-hicache' if h else ''}" for k, p, h in CONFIGS])
def test_a_page_damaged_before_it_fills_is_never_served(kind, page, hicache, tmp_path):
    s = server(kind, page, hicache, str(tmp_path / "log.jsonl"))
    rng = random.Random(f"{kind}-{page}-{hicache}")
    tally = Tally()
    mismatches = metric("capbench_kv_checksum_mismatch_total", source="insert")
    try:
        for i in range(2 * TRIALS):
            trial(s, rng, tally, damage=i % 2 == 0)
    finally:
        s.close()
    print(f"\n{kind}-p{page}{'-hicache' if hicache else ''}: {tally.trials} damaged trials ({tally.prompt_tail} "
          f"prompt tails, {tally.decode_page} decode pages), {tally.detected} found at fill; {tally.controls} clean "
          f"controls; {tally.served_pages} cached pages served to q, {tally.served_corrupt} corrupt")
    assert tally.trials == TRIALS and tally.detected == TRIALS and tally.served_corrupt == 0
    assert metric("capbench_kv_checksum_mismatch_total", source="insert") - mismatches == TRIALS


# ---- damaged records and state bytes ----

RECORDS = [("state", 16), ("seal", 16), ("rows", 64), ("state", 64)]


@pytest.mark.parametrize("record,page", RECORDS, ids=[f"{r}-p{p}" for r, p in RECORDS])
@pytest.mark.parametrize("kind", ["mha", "mla"])
def test_a_damaged_record_or_state_byte_is_counted_apart_from_data_damage(kind, record, page, tmp_path):
    """Flip a bit of a cached page's state byte, page seal or row records: the page's KV is intact. The flip is
    logged and counted as what it is, never as data damage, and the intact page is still served."""
    s = server(kind, page, False, str(tmp_path / "log.jsonl"))
    rng = random.Random(f"{kind}-{record}-{page}")
    try:
        P = page
        prompt = [rng.randrange(1, 40_000) for _ in range(3 * P + 2)]
        s.submit("r", prompt, [1, 2, 3])
        run(s)
        seals = s.tree.kv_seals
        cached = seals.pages_of(s.tree.all_values_flatten().to(torch.int64))
        target = int(cached[1])
        assert int(seals.state[target]) == SEALED
        flag0 = metric("capbench_kv_checksum_flag_damage_total")
        rec0 = {r: metric("capbench_kv_checksum_record_damage_total", record=r) for r in ("seal", "rows")}
        data0 = metric("capbench_kv_checksum_mismatch_total", source="admission")
        bit = 1 << rng.randrange(8)
        if record == "state":
            seals.state[target] ^= bit
        elif record == "seal":
            seals.sums[target, rng.randrange(seals.sums.shape[1])] ^= bit << 40
        else:
            seals.rows[target * P + rng.randrange(P)] ^= bit
        q = s.submit("q", prompt + [4], [5])
        run(s)
        assert s.served.corrupt == 0
        events = events_of(s)
        kinds = [e["kind"] for e in events]
        assert "kv_checksum_mismatch" not in kinds
        assert metric("capbench_kv_checksum_mismatch_total", source="admission") == data0
        if record == "state":
            assert metric("capbench_kv_checksum_flag_damage_total") == flag0 + 1
            assert [e["page"] for e in events if e["kind"] == "kv_checksum_flag_damage"] == [target]
        else:
            assert metric("capbench_kv_checksum_record_damage_total", record=record) == rec0[record] + 1
            assert [e["detail"]["record"] for e in events if e["kind"] == "kv_checksum_record_damage"] == [record]
        assert q.admitted_prefix == (3 * P + 2) // P * P  # the intact page is still served
    finally:
        s.close()


# ---- PD disaggregation: KV a decode server receives ----


@pytest.mark.parametrize("hooked", [True, False], ids=["sealed-on-arrival", "unhooked"])
def test_kv_a_pd_decode_server_receives_is_sealed_on_arrival(hooked, tmp_path):
    """The prompt's KV lands in r's row without a forward (the transfer engine wrote it); SGLang's prebuilt batch for
    it goes through `SchedulerDisaggregationDecodeMixin._verify_kv_checksums`, hooked to seal it. A row of the
    received last page, not yet full, is damaged; r decodes over it and fills the page. Sealed on arrival, the
    damage is found at the fill and nothing computed over it is cached. Unhooked (control), the page fills with
    rows nobody recorded: it is dropped as damaged even when intact (a false alarm, so the hook is needed)."""
    from types import SimpleNamespace

    from sglang.srt.disaggregation.decode import SchedulerDisaggregationDecodeMixin

    from engine_patches.kv_checksum import hooks

    hooks.install_seal_on_arrival()
    verify = SchedulerDisaggregationDecodeMixin._verify_kv_checksums
    assert getattr(verify, "_capbench_seals", False)
    s = Server(geometry("mla", 16), derive=True, received=True, log=str(tmp_path / "log.jsonl"))
    scheduler = SimpleNamespace(kv_checksum_computer=None, token_to_kv_pool_allocator=s.allocator)
    s.after_forward = lambda batch: verify(scheduler, batch) if hooked and batch.forward_mode.is_extend() else None
    rng = random.Random("pd")
    P, n = 16, 2 * 16 + 5
    try:
        found = []
        for rid, damage in (("clean", False), ("damaged", True)):
            prompt = [rng.randrange(1, 40_000) for _ in range(n)]
            out = [rng.randrange(1, 40_000) for _ in range(P)]
            r = s.submit(rid, prompt, out)
            s.step()  # the arrival (and, hooked, its seal)
            if damage:
                damage_row(s, r, n - 2, rng)  # a received row of the last page, not yet full
            run(s)
            q = s.submit(f"q-{rid}", prompt + out + [9], [8])
            run(s)
            found.append([e for e in events_of(s) if e["kind"] == "kv_checksum_mismatch"])
            if hooked or damage:
                assert q.admitted_prefix == (2 * P if damage else (n + P - 1) // P * P)
        assert s.served.corrupt == 0
        if hooked:  # the clean arrival raises nothing; the damaged one is found when its page fills
            assert found[0] == [] and [e["detail"]["part"] for e in found[1]] == ["rows"]
        else:  # unrecorded rows: the clean page is dropped as if damaged
            assert [e["detail"]["part"] for e in found[0]] == ["rows"]
    finally:
        s.close()
