"""The HiCache host-copy check off the scheduler thread: a worker thread checksums the host pages a load-back asks
for and compares them with their carried seals, while the scheduler goes on with its step.

A load asked for inside an admission step is submitted here and deferred (SGLang's own "retry without committing
a load": `init_load_back` returns None, the request stays queued); a later step finds the verdict ready and loads
the pages if they are clean, or refuses the load as before. Each verdict is used once, by the load that asked for
it, so the pages are checked after that load was asked for and at most a step before its copy is queued.
"""

from __future__ import annotations

import queue
import threading

import torch


class HostCheckWorker:
    def __init__(self, partials):
        """`partials(host_pages)`: per-buffer sums of host pages (HostSeals.partials)."""
        self._partials = partials
        self._queue: queue.Queue = queue.Queue()
        self._done: dict[tuple, list[int]] = {}  # key -> rows found differing from their seals
        self._asked: set[tuple] = set()
        self._lock = threading.Lock()
        self.threads: set[int] = set()  # idents of the threads that ran a check (tests: never the scheduler's)
        self._thread = threading.Thread(target=self._run, name="capbench-kv-host-check", daemon=True)
        self._thread.start()

    def verdict(self, key: tuple, host_pages: torch.Tensor, sums: torch.Tensor) -> list[int] | None:
        """Rows of `host_pages` that differ from `sums`, once the worker has checked them for this `key`; None
        while pending (the first call submits them)."""
        with self._lock:
            if key in self._done:
                self._asked.discard(key)
                return self._done.pop(key)
            if key in self._asked:
                return None
            self._asked.add(key)
        self._queue.put((key, host_pages.clone(), sums.clone()))
        return None

    def drain(self) -> None:
        """Wait until every submitted check is done (tests, shutdown)."""
        self._queue.join()

    def _run(self) -> None:
        while True:
            key, pages, sums = self._queue.get()
            try:
                self.threads.add(threading.get_ident())
                try:
                    differs = (self._partials(pages) != sums).any(dim=1).nonzero().flatten().tolist()
                except Exception:  # a check that cannot run vouches for nothing: the load is refused
                    differs = list(range(len(pages)))
                with self._lock:
                    if key in self._asked:
                        self._done[key] = differs
            finally:
                self._queue.task_done()
