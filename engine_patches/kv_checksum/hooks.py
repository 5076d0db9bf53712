"""The hooks the checksummed tree needs outside itself, installed on SGLang's classes in every process:

- seal on write: after each `ModelRunner.forward` (eager or a replayed CUDA graph alike: the hook runs outside the
  graph), the rows that forward wrote are recorded and the pages it completed are checked against their rows and
  sealed, on the forward stream, with no host sync. Every writer counts, fused kernels included, because the seal
  reads the pool's bytes, not the write calls.
- seal on arrival (PD decode servers): KV received from a prefill server (or restored from a retraction backup) is
  written by the transfer, not by a forward. It is recorded and sealed the same way when it enters a batch: in
  `get_new_prebuilt_batch`, where SGLang verifies its own transfer checksum after the bytes have landed and before
  `process_prebuilt` caches any of it; the prebuilt batch's `out_cache_loc` is exactly the slots that arrived.
- admission: `Req.init_next_round_input` is the match the scheduler makes to admit a request into a prefill
  batch; the tree checks the pages of that match, and of no other (ordering the queue matches every waiting
  request, often).
- load wait: a request whose admission match reached pages a HiCache load is still copying in (PENDING: they
  cannot have been checked) is not admitted in this step: `PrefillAdder.add_one_req` answers `AddReqResult.OTHER`,
  SGLang's own "stop admitting this step, keep the request queued", before it reserves or loads anything.
"""

from __future__ import annotations

import functools

import torch

from engine_patches.kv_checksum.seals import PageSeals

_SEALS: dict[int, PageSeals] = {}  # id(KV pool) -> its seal table, registered by the checksummed tree


def register_seals(kv_pool, seals: PageSeals) -> None:
    _SEALS[id(kv_pool)] = seals


def seal_after_forward(kv_pool, out_cache_loc: torch.Tensor | None) -> None:
    """Seal the pages completed by a forward that wrote KV at `out_cache_loc` (no-op for unchecked pools)."""
    seals = _SEALS.get(id(kv_pool))
    if seals is not None and out_cache_loc is not None and out_cache_loc.numel():
        seals.seal_written(out_cache_loc)


def install_seal_on_fill() -> None:
    from sglang.srt.model_executor.model_runner import ModelRunner

    forward = ModelRunner.forward
    if getattr(forward, "_capbench_seals", False):
        return

    @functools.wraps(forward)
    def forward_and_seal(self, forward_batch, *args, **kwargs):
        out = forward(self, forward_batch, *args, **kwargs)
        if not self.is_draft_worker:
            seal_after_forward(self.token_to_kv_pool, getattr(forward_batch, "out_cache_loc", None))
        return out

    forward_and_seal._capbench_seals = True
    ModelRunner.forward = forward_and_seal


def install_seal_on_arrival() -> None:
    from sglang.srt.disaggregation.decode import SchedulerDisaggregationDecodeMixin

    verify = SchedulerDisaggregationDecodeMixin._verify_kv_checksums
    if getattr(verify, "_capbench_seals", False):
        return

    @functools.wraps(verify)
    def seal_and_verify(self, batch):
        kv_pool = self.token_to_kv_pool_allocator.get_kvcache()
        seal_after_forward(getattr(kv_pool, "full_kv_pool", kv_pool), getattr(batch, "out_cache_loc", None))
        return verify(self, batch)

    seal_and_verify._capbench_seals = True
    SchedulerDisaggregationDecodeMixin._verify_kv_checksums = seal_and_verify


def install_admission_mark() -> None:
    from sglang.srt.managers.schedule_batch import Req

    init = Req.init_next_round_input
    if getattr(init, "_capbench_admission", False):
        return

    @functools.wraps(init)
    def init_marked(self, tree_cache=None, cow_mamba=None):
        admission = getattr(tree_cache, "kv_admission", None)
        if admission is None:
            return init(self, tree_cache, cow_mamba)
        with admission(self):
            return init(self, tree_cache, cow_mamba)

    init_marked._capbench_admission = True
    Req.init_next_round_input = init_marked


def install_step_batching() -> None:
    """Batch the admission checks of each scheduler step (step.py): the step's admission pass runs inside the tree's
    `kv_step`, whose candidates are the waiting queue's first requests, as many as the step can admit."""
    from sglang.srt.managers.scheduler import Scheduler

    raw = Scheduler._get_new_batch_prefill_raw
    if getattr(raw, "_capbench_step", False):
        return

    @functools.wraps(raw)
    def prefill_in_step(self, prefill_delayer_single_pass, running_batch):
        step = getattr(self.tree_cache, "kv_step", None)
        if step is None:
            return raw(self, prefill_delayer_single_pass, running_batch)

        def candidates():
            room = self.get_num_allocatable_reqs(len(running_batch.reqs), running_batch=running_batch)
            return self.waiting_queue[: max(1, room)]

        with step(candidates):
            return raw(self, prefill_delayer_single_pass, running_batch)

    prefill_in_step._capbench_step = True
    Scheduler._get_new_batch_prefill_raw = prefill_in_step


def install_load_wait() -> None:
    from sglang.srt.managers.schedule_policy import AddReqResult, PrefillAdder

    add = PrefillAdder.add_one_req
    if getattr(add, "_capbench_load_wait", False):
        return

    @functools.wraps(add)
    def add_unless_loading(self, req, *args, **kwargs):
        if getattr(self.tree_cache, "kv_load_wait", None) is req:
            self.tree_cache.kv_load_wait = None
            return AddReqResult.OTHER
        return add(self, req, *args, **kwargs)

    add_unless_loading._capbench_load_wait = True
    PrefillAdder.add_one_req = add_unless_loading
