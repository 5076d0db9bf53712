"""The seal table of one KV pool: two records of what was written, and each page's state.

- Row records (`rows`, 8 bytes a slot): each written row's share of its page checksum, taken right after the
  forward that wrote it (`seal_written`, on the forward stream, no host sync). Rows fill in slot order, so a page
  that is not yet full has all of its written rows recorded.
- Page seals (`sums`, 8 bytes a layer buffer and page): the page's per-buffer checksums, taken when its last row is
  written. At that moment the seal is compared with the sum of the page's row records: damage to a written row of a
  page that is not yet full (a decode page, a prompt's last page) is found then, and the page is marked bad instead
  of being sealed with the damage.
- State, one byte a page, a code with four bits between any two states, so a flipped state byte reads as no state
  at all and is logged as flag damage instead of silently changing what the page is.

A check compares the page's bytes with its seal and, for pages sealed at fill, with its row records too: data that
differs from both records is data damage; a seal that alone differs from the data and the rows is seal damage,
repaired; row records that alone differ are dropped (the page keeps its seal). Pages that reach a check without a
seal (written by a path no hook sees) are sealed there ("late" seals, no row records). Freeing a page forgets it.
"""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass, field

import torch

from engine_patches.kv_checksum.checksum import (
    buffer_layers,
    page_partials_reference,
    paged_words,
    pool_buffers,
    row_buffers,
    row_sums_reference,
)

# Page states: pairwise Hamming distance 4.
FREE = 0x00  # no seal: free, or still filling (its written rows are recorded)
SEALED = 0x0F  # sealed when it filled, row records kept
LATE = 0x33  # sealed at a check or carried from host: page seal only
BAD = 0xF0  # found damaged
PENDING = 0x3C  # sealed, bytes still being loaded (HiCache): not compared until acknowledged
FILL_BAD = 0xCC  # found damaged when it filled (before its seal): logged at the next check, then BAD
STATES = {FREE: "free", SEALED: "sealed", LATE: "late", BAD: "bad", PENDING: "pending", FILL_BAD: "fill_bad"}


@dataclass
class Check:
    """The outcome of checking a batch of pages: row positions (into the checked page list) that are bad."""

    bad_rows: list[int]  # found bad now or before, in order
    new_rows: list[int]  # data damage found by this check (or at the page's fill)
    compared: int  # pages compared against a seal
    late: int  # pages sealed here because they had no seal yet
    mismatched: list[tuple[int, int | None, str]]  # (page, layer, part) of newly bad data; part "rows": before fill
    seal_damaged: list[tuple[int, str]] = field(default_factory=list)  # (page, "seal" | "rows"): record, not data
    flag_damaged: list[tuple[int, int, bool]] = field(default_factory=list)  # (page, state byte, page kept)
    filled: int = 0  # pages sealed on fill since the last check
    pending_rows: list[int] = field(default_factory=list)  # pages whose bytes are still being loaded (not compared)


class PageSeals:
    def __init__(self, kv_pool, page_size: int):
        self._init(pool_buffers(kv_pool), buffer_layers(kv_pool), page_size)

    @classmethod
    def of_buffers(cls, buffers: list[torch.Tensor], page_size: int) -> PageSeals:
        """A seal table over bare [slots, ...] buffers (the GPU check's pools, shaped like SGLang's)."""
        seals = cls.__new__(cls)
        seals._init(buffers, [(i, "kv") for i in range(len(buffers))], page_size)
        return seals

    def _init(self, buffers: list[torch.Tensor], layers: list[tuple[int, str]], page_size: int) -> None:
        self.buffers, self.layers = buffers, layers
        for b in self.buffers:
            paged_words(b, page_size)  # refuse pages that are not whole 64-bit words now, not at the first seal
        self.row_buffers = row_buffers(self.buffers)  # the buffers row records cover (FP4 scale rows: not)
        self.page_size = page_size
        self.num_pages = self.buffers[0].shape[0] // page_size
        self.device = self.buffers[0].device
        self.sums = torch.zeros((self.num_pages, len(self.buffers)), dtype=torch.int64, device=self.device)
        self.rows = torch.zeros(self.num_pages * page_size, dtype=torch.int64, device=self.device)
        self.state = torch.zeros(self.num_pages, dtype=torch.uint8, device=self.device)
        self._codes = torch.tensor(list(STATES), dtype=torch.uint8, device=self.device)
        self._filled = torch.zeros((), dtype=torch.int64, device=self.device)  # pages sealed on fill, ever
        self._filled_seen = 0  # of those, already reported by a check
        self._kernel = None
        self._stream = None
        if self.device.type == "cuda":
            from engine_patches.kv_checksum.kernel import PageChecksummer

            self._kernel = PageChecksummer(self.buffers, page_size)
            # Checks run on a stream of their own, so their read-back waits for the check, not for the forward in
            # flight (SGLang's schedule stream is fenced behind it). The pages a check reads were sealed by forwards
            # whose results the scheduler has already read back, so their seals are complete.
            self._stream = torch.cuda.Stream(device=self.device)

    # ---- state views (read-only) ----

    @property
    def sealed(self) -> torch.Tensor:
        return (self.state == SEALED) | (self.state == LATE) | (self.state == BAD) | (self.state == PENDING) | (
            self.state == FILL_BAD)

    @property
    def bad(self) -> torch.Tensor:
        return (self.state == BAD) | (self.state == FILL_BAD)

    @property
    def pending(self) -> torch.Tensor:
        return self.state == PENDING

    def _set(self, pages: torch.Tensor, code: int) -> None:
        self.state[pages] = code

    # ---- checksums ----

    def partials(self, pages: torch.Tensor) -> torch.Tensor:
        """Current per-buffer sums [pages, buffers] of the given page ids."""
        if self._kernel is not None:
            return self._kernel.partials(pages)
        return page_partials_reference(self.buffers, pages, self.page_size)

    def row_sums(self, slots: torch.Tensor) -> torch.Tensor:
        if self._kernel is not None:
            return self._kernel.row_sums(slots, self.row_buffers)
        return row_sums_reference(self.buffers[: self.row_buffers], slots, self.page_size)

    def pages_of(self, slots: torch.Tensor) -> torch.Tensor:
        """Page ids of page-aligned slot runs (tree values, request rows)."""
        return (slots[:: self.page_size] // self.page_size).to(torch.int64)

    # ---- seal ----

    def seal(self, pages: torch.Tensor) -> None:
        """Seal pages as their bytes are now (no row records)."""
        self.sums[pages] = self.partials(pages)
        self._set(pages, LATE)

    def carry(self, pages: torch.Tensor, sums: torch.Tensor) -> None:
        """Seals carried with bytes still being copied in (a HiCache load): not compared until `arrived`."""
        self.sums[pages] = sums
        self._set(pages, PENDING)

    def arrived(self, pages: torch.Tensor) -> None:
        pages = pages.to(self.device)
        self.state[pages] = torch.where(self.state[pages] == PENDING, LATE, self.state[pages])

    def seal_written(self, slots: torch.Tensor) -> None:
        """Record the rows just written at `slots` and seal the pages they completed, checking each completed page
        against its row records first. A page is full once its last slot is written (pages fill in slot order).
        No host sync; the fill count is read back with the next check's flags."""
        slots = slots.to(device=self.device, dtype=torch.int64)
        if slots.numel() == 0:
            return
        P = self.page_size
        self.rows[slots] = self.row_sums(slots)
        last = slots % P == P - 1
        self._filled += last.sum()
        if self._kernel is not None:
            self._kernel.partials_into(self.sums, torch.where(last, slots // P, -1))
            pages = torch.where(last, slots // P, 0)  # page 0 is SGLang's padding page: scratch for the others
        else:
            if not bool(last.any()):
                return
            pages = slots[last] // P
            self.sums[pages] = self.partials(pages)
            last = torch.ones_like(pages, dtype=torch.bool)
        clean = self.sums[pages, : self.row_buffers].sum(dim=1) == self.rows.view(-1, P)[pages].sum(dim=1)
        code = torch.where(clean, SEALED, FILL_BAD).to(torch.uint8)
        self.state[pages] = torch.where(last, code, self.state[pages])

    def forget(self, pages: torch.Tensor) -> None:
        self._set(pages, FREE)

    def mark_bad(self, pages: torch.Tensor) -> None:
        self._set(pages, BAD)

    # ---- check ----

    def check(self, pages: torch.Tensor, known_only: torch.Tensor | None = None, seal_missing: bool = True) -> Check:
        """Compare `pages` with their records and report bad pages. `known_only` marks pages (same length) that are
        only looked up for an earlier bad mark, not compared; unsealed pages are sealed now unless `seal_missing` is
        off. Pages whose bytes are still being loaded are not compared. One host read-back."""
        if pages.numel() == 0:
            return Check([], [], 0, 0, [])
        with self.side():
            return self._check(pages, known_only, seal_missing)

    def side(self):
        """Run the enclosed GPU work on the checks' own stream (a no-op off CUDA). Callers put the computation of
        the pages to check inside it too: it reads tree values and request rows written before forwards that have
        completed, never anything queued behind the forward in flight."""
        return torch.cuda.stream(self._stream) if self._stream is not None else nullcontext()

    def read_back(self, flags: torch.Tensor) -> torch.Tensor:
        """The one device-to-host copy of a check (a GPU->CPU sync on CUDA): every verdict comes back through here."""
        return flags.cpu()

    def _check(self, pages: torch.Tensor, known_only: torch.Tensor | None, seal_missing: bool) -> Check:
        n = pages.numel()
        P = self.page_size
        pages = pages.to(device=self.device, dtype=torch.int64)
        lookup = torch.zeros(n, dtype=torch.bool, device=self.device) if known_only is None else \
            known_only.to(self.device)
        state = self.state[pages]
        expected = self.sums[pages]
        now = self.partials(pages)
        differs = now != expected
        moved = differs.any(dim=1)
        rows_agree = now[:, : self.row_buffers].sum(dim=1) == self.rows.view(-1, P)[pages].sum(dim=1)
        with_rows, late_sealed = state == SEALED, state == LATE
        compare = ~lookup & (with_rows | late_sealed)
        # data damage: the bytes differ from the page seal and (where kept) from the row records
        new_after = compare & moved & ~(with_rows & rows_agree & ~differs[:, self.row_buffers:].any(dim=1))
        at_fill = state == FILL_BAD  # the page seal took damaged bytes; the row records did not
        # the seal alone is off: the bytes agree with the row records and differ from the seal only in buffers
        # the rows cover (a scale buffer that differs is data: no second record vouches for it)
        seal_bad = compare & with_rows & moved & rows_agree & ~differs[:, self.row_buffers:].any(dim=1)
        rows_bad = compare & with_rows & ~moved & ~rows_agree
        flag_bad = ~torch.isin(state, self._codes)
        kept = flag_bad & ~moved & rows_agree  # a damaged state byte over a page both records vouch for
        late = (state == FREE) & ~lookup & seal_missing
        new = new_after | at_fill
        known = state == BAD
        self.sums[pages] = torch.where((late | seal_bad)[:, None], now, expected)
        code = torch.where(late | rows_bad, LATE, state)
        code = torch.where(new | (flag_bad & ~kept), BAD, code)
        code = torch.where(kept, SEALED, code)
        self.state[pages] = code.to(torch.uint8)
        flags = torch.stack([new, known, late, compare, seal_bad, rows_bad, flag_bad, kept, at_fill,
                             flag_bad & ~kept])
        # the one host read-back: flags, state bytes and the fill count together
        back = self.read_back(torch.cat([flags.to(torch.int64).flatten(), state.to(torch.int64),
                                         self._filled.view(1)]))
        filled, self._filled_seen = int(back[-1]) - self._filled_seen, int(back[-1])
        f = back[: flags.numel()].view(flags.shape).bool()
        found_state = back[flags.numel(): flags.numel() + n]
        rows_of = lambda k: f[k].nonzero().flatten().tolist()  # noqa: E731
        new_rows = rows_of(0)
        mismatched = []
        after_rows = [r for r in new_rows if not f[8, r]]
        if after_rows:
            for row, b in differs[after_rows].nonzero().tolist():
                layer, part = self.layers[b]
                mismatched.append((int(pages[after_rows[row]]), layer, part))
        mismatched += [(int(pages[r]), None, "rows") for r in rows_of(8)]
        seal_damaged = [(int(pages[r]), "seal") for r in rows_of(4)] + [(int(pages[r]), "rows") for r in rows_of(5)]
        flag_damaged = [(int(pages[r]), int(found_state[r]), bool(f[7, r])) for r in rows_of(6)]
        bad_rows = (f[0] | f[1] | f[9]).nonzero().flatten().tolist()
        pending_rows = (found_state == PENDING).nonzero().flatten().tolist()
        return Check(bad_rows, new_rows, int(f[3].sum()), int(f[2].sum()), mismatched, seal_damaged, flag_damaged,
                     filled, pending_rows)


def forget_on_free(allocator, seals: PageSeals) -> None:
    """Make the allocator forget a page's seal whenever it takes the page back. Hooks the one method every free
    of the allocator goes through: the paged allocator's page release, or the token allocator's free (page
    size 1: slots are pages)."""
    from sglang.srt.mem_cache.allocator.paged import PagedTokenToKVPoolAllocator
    from sglang.srt.mem_cache.allocator.token import TokenToKVPoolAllocator

    if type(allocator) is PagedTokenToKVPoolAllocator:
        release = allocator._release_page_ids

        def release_and_forget(*page_ids: torch.Tensor):
            for ids in page_ids:
                seals.forget(ids)
            return release(*page_ids)

        allocator._release_page_ids = release_and_forget
    elif type(allocator) is TokenToKVPoolAllocator:
        free = allocator.free

        def free_and_forget(free_index: torch.Tensor):
            if free_index.numel():
                seals.forget(free_index.to(torch.int64))
            return free(free_index)

        allocator.free = free_and_forget
    else:
        raise ValueError(f"KV checksums support SGLang's paged and token allocators, not {type(allocator).__name__}")
