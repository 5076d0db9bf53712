"""Ranks of a CPU "distributed" test as forks of one process: what it imported (torch, SGLang: seconds of CPU
each) is shared, not imported again per rank. Used by step_rank_worker.py and tp_load_worker.py."""

import os
import sys
import traceback
from collections.abc import Callable, Iterable


def fork_each(ranks: Iterable[int], out_pattern: str, run: Callable[[int, str], None]) -> int:
    """run(rank, out) in a fork per rank, its stdout and stderr in out + '.log' (out = out_pattern with the rank);
    0 when every rank returned, else 1 with the failed ranks' logs printed."""
    pids = {}
    for rank in ranks:
        out = out_pattern.format(rank=rank)
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                log = os.open(out + ".log", os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
                os.dup2(log, 1)
                os.dup2(log, 2)
                run(rank, out)
                code = 0
            except BaseException:
                traceback.print_exc()
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(code)
        pids[pid] = rank
    failed = []
    for _ in pids:
        pid, status = os.wait()
        if os.waitstatus_to_exitcode(status) != 0:
            failed.append(pids[pid])
    for rank in sorted(failed):
        print(f"rank {rank} failed:\n" + open(out_pattern.format(rank=rank) + ".log").read()[-3000:])
    return 1 if failed else 0
