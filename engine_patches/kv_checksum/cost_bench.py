"""What the KV checksum's per-step work costs on this CPU, medians and ratios from one run (torch reference path,
the one that runs here; GPU figures come from `capbench gpu-check`'s checksum section).

- seal per decode step: `PageSeals.seal_written` (row records + the page seal of each page the step completes,
  checked against its rows) against the page seal alone (what sealing cost before row records), batch 1/32/256,
  every request completing a page (the worst step) and none completing one (the common step);
- check: `PageSeals.check` of a request's cached pages (one read-back of flags, state and fill count together)
  against the bare checksum of the same pages;
- admission checks per step: 1/32/256 requests' cached pages checked in one `PageSeals.check` (step.py) against one
  check per request, medians and ratio;
- HiCache load-back of a 4k-token prefix: the inline host-copy check (`HostSeals.partials`, scheduler thread,
  CAPBENCH_KV_HOST_CHECK_INLINE=1) against the default, which checksums no host page: the loaded pages join the
  next step's batched admission check on the device (the marginal cost of adding them to a step's check of 32
  requests' pages; on a GPU that check runs at HBM speed: `capbench gpu-check`).

    .venv/bin/python bench/benchmarks/kv_checksum_cost.py [--layers 4] [--reps 7]
"""

from __future__ import annotations

import argparse

import torch

from engine_patches.kv_checksum.benchmark import median_s
from engine_patches.kv_checksum.hicache import HostSeals
from engine_patches.kv_checksum.seals import PageSeals


def median_ms(fn, reps: int) -> float:
    return median_s(fn, reps) * 1e3  # benchmark.py's timing, in ms


def kimi_like(layers: int, slots: int, gen: torch.Generator) -> list[torch.Tensor]:
    """Kimi K2's MLA latent rows (576 bytes in fp8, stored as uint8), `layers` of its 61 layers."""
    return [torch.randint(0, 256, (slots, 1, 576), dtype=torch.uint8, generator=gen) for _ in range(layers)]


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--layers", type=int, default=4, help="layers of Kimi K2's 61 (work scales with layers)")
    p.add_argument("--reps", type=int, default=7)
    p.add_argument("--page-size", type=int, default=64)
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    P, gen = args.page_size, torch.Generator().manual_seed(0)
    pages = 1024
    seals = PageSeals.of_buffers(kimi_like(args.layers, pages * P, gen), P)
    print(f"torch {torch.__version__}, 1 thread, Kimi K2 MLA fp8 rows, {args.layers} layers, page {P}, "
          f"{pages} pages; host shared and loaded: compare ratios, not absolute times")
    print(f"{'seal per decode step':<44}{'batch':>6}{'seal_written ms':>17}{'page seal only ms':>19}{'ratio':>8}")
    for bs in (1, 32, 256):
        chosen = torch.randperm(pages - 1, generator=gen)[:bs] + 1
        for label, offset in (("every request completes a page", P - 1), ("no page completes", P // 2)):
            slots = chosen * P + offset
            full = chosen if offset == P - 1 else chosen[:0]
            new = median_ms(lambda slots=slots: seals.seal_written(slots), args.reps)
            old = median_ms(lambda full=full: seals.sums.index_put_((full,), seals.partials(full)), args.reps)
            ratio = f"{new / old:8.2f}" if old > 1e-3 else "       -"
            print(f"  {label:<42}{bs:>6}{new:>17.3f}{old:>19.3f}{ratio}")
    print(f"{'check of a cached prefix':<44}{'pages':>6}{'check ms':>17}{'checksum only ms':>19}{'ratio':>8}")
    for n in (64, 512):  # 4k and 32k tokens at page 64
        chosen = torch.randperm(pages - 1, generator=gen)[:n] + 1
        seals.seal(chosen)
        new = median_ms(lambda chosen=chosen: seals.check(chosen), args.reps)
        bare = median_ms(lambda chosen=chosen: seals.partials(chosen), args.reps)
        print(f"  {'PageSeals.check, one read-back':<42}{n:>6}{new:>17.3f}{bare:>19.3f}{new / bare:8.2f}")
    step_checks(seals, pages, args.reps, gen)
    host = kimi_like(args.layers, (4096 // P + 1) * P, gen)
    host_seals = HostSeals.of_views(host, P)
    host_pages = torch.arange(1, 4096 // P + 1)
    nbytes = sum(v[P:].numel() for v in host)
    t = median_ms(lambda: host_seals.partials(host_pages), args.reps)
    dev = median_ms(lambda: seals.check(torch.arange(1, 4096 // P + 1)), args.reps)
    full = 61 / args.layers
    print(f"HiCache host-copy check of a 4k-token prefix (HostSeals.partials, scheduler thread): {t:.1f} ms, "
          f"{nbytes / t / 1e6:.3f} GB/s; x {full:.2f} for all 61 layers: {t * full:.0f} ms; the same pages' device "
          f"check on this CPU: {dev:.1f} ms (ratio {t / dev:.2f})")
    step = torch.randperm(pages - 1 - 4096 // P, generator=gen)[: 32 * 8] + 1 + 4096 // P  # 32 requests' pages
    seals.seal(step)
    loaded = torch.cat([step, torch.arange(1, 4096 // P + 1)])
    base = median_ms(lambda: seals.check(step), args.reps)
    with_load = median_ms(lambda: seals.check(loaded), args.reps)
    print(f"HiCache load-back, default (load first, check on the device): scheduler-thread host checksum 0 ms; "
          f"the loaded pages in the next step's admission check: {base:.1f} -> {with_load:.1f} ms "
          f"(+{with_load - base:.1f} ms on this CPU's reference path, same read-back) against {t:.1f} ms inline; "
          f"the loading request waits for its load plus one step")


def step_checks(seals: PageSeals, pool_pages: int, reps: int, gen: torch.Generator, per_req: int = 8) -> None:
    """A step's admission checks (`per_req` cached pages a request, distinct pages): one `PageSeals.check` per request
    (one read-back each) against one check of all of them (step.py: one read-back a step)."""
    print(f"{'admission checks per step':<44}{'checks':>6}{'batched ms':>17}{'one-by-one ms':>19}{'ratio':>8}"
          f"{'read-backs':>12}")
    for n in (1, 32, 256):
        chosen = (torch.randperm(pool_pages - 1, generator=gen)[: n * per_req] % (pool_pages - 1) + 1) \
            if n * per_req < pool_pages else torch.randint(1, pool_pages, (n * per_req,), generator=gen)
        seals.seal(chosen)
        each = list(chosen.view(n, per_req))
        batched = median_ms(lambda chosen=chosen: seals.check(chosen), reps)
        alone = median_ms(lambda each=each: [seals.check(p) for p in each], reps)
        print(f"  {f'{per_req} pages a request':<42}{n:>6}{batched:>17.3f}{alone:>19.3f}{alone / batched:8.2f}"
              f"{f'1 vs {n}':>12}")


if __name__ == "__main__":
    main()
