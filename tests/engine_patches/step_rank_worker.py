"""One of two tensor-parallel ranks (gloo on CPU) running one admission step of the checksummed tree
(test_kv_checksum_step.py). Usage: python -m tests.engine_patches.step_rank_worker PORT OUT.json, with `{rank}` in
OUT.json: both ranks as forks of one process that imported torch and SGLang once; exits non-zero if either failed.

Both ranks build the same cached prefixes on SGLang's real pool and tree; only rank 0 damages a page. The tree's
`_all_reduce` is torch.distributed's over the two ranks (SGLang's own goes through its TP group: same call)."""

import json
import sys

import torch
import torch.distributed as dist

import tests.conftest  # noqa: F401  (the test environment: torchvision stub, caches)


def main(rank: int, port: int, out: str) -> None:
    from tests.engine_patches.test_kv_checksum_step import PREFIX_PAGES, G, cached_pages, warm_server

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    s, prefixes = warm_server(7)
    try:
        if rank == 0:
            s.flip(cached_pages(s, prefixes[0])[2])
        tree = s.tree
        tree.tp_world_size = 2
        calls, backs = [], []

        def all_reduce(t: torch.Tensor, op) -> None:
            calls.append(t.numel())
            dist.all_reduce(t, op=op)

        tree._all_reduce = all_reduce
        read_back = tree.kv_seals.read_back
        tree.kv_seals.read_back = lambda t: backs.append(1) or read_back(t)
        owners = [i % 4 for i in range(32)]
        reqs = [s.submit(f"r{i}", prefixes[k] + [9, 9, i], [5]) for i, k in enumerate(owners)]
        with tree.kv_step(lambda: reqs):
            for req in reqs:
                req.init_next_round_input(tree)
        json.dump({"prefix_lens": [r.prefix_len for r in reqs], "owners": owners, "all_reduces": calls,
                   "read_backs": len(backs), "full": PREFIX_PAGES * G.page_size}, open(out, "w"))
    finally:
        s.close()
        dist.destroy_process_group()


def fork_ranks(port: int, out_pattern: str) -> int:
    from tests.engine_patches import test_kv_checksum_step  # noqa: F401  (SGLang's pool and tree: seconds of CPU)
    from tests.engine_patches.forked import fork_each

    return fork_each((0, 1), out_pattern, lambda rank, out: main(rank, port, out))


if __name__ == "__main__":
    sys.exit(fork_ranks(int(sys.argv[1]), sys.argv[2]))
