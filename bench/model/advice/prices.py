"""Which price each GPU of a question is costed at: the price given for --gpu, those given per GPU
(`--price h200=3.10,b200=5.20`), else the catalog's indicative price; and a price that would go unused (a GPU the
plan never looks at) refused, so no GPU silently keeps the catalog's price while the user thinks it has theirs."""

from __future__ import annotations

from typing import Protocol

from bench.errors import BadInput
from bench.model.fits import catalog


class Priced(Protocol):  # advice.plan.Question, without importing it back
    gpu: str
    price_per_gpu_hour: float | None
    gpu_prices: tuple[tuple[str, float], ...]
    search_gpus: tuple[str, ...] | None


def price_of(q: Priced, gpu: str) -> float:
    if gpu == q.gpu and q.price_per_gpu_hour is not None:
        return q.price_per_gpu_hour
    return dict(q.gpu_prices).get(gpu, catalog.gpu(gpu).price_per_gpu_hour)


def costed(q: Priced) -> dict[str, tuple[float, bool]]:
    """Every GPU asked about or searched: its $ per GPU-hour and whether it was given (else the catalog's)."""
    given = dict(q.gpu_prices)
    if q.price_per_gpu_hour is not None:
        given[q.gpu] = q.price_per_gpu_hour
    gpus = dict.fromkeys([q.gpu, *(q.search_gpus or catalog.gpus()), *given])
    return {g: (given[g], True) if g in given else (catalog.gpu(g).price_per_gpu_hour, False) for g in gpus}


def check(q: Priced) -> None:
    for g, price in q.gpu_prices:
        catalog.gpu(g)
        if q.search_gpus and g not in (q.gpu, *q.search_gpus):
            raise BadInput(f"a price was given for {g}, which is neither --gpu nor among --gpus "
                           f"({','.join(q.search_gpus)})")
        if not price >= 0:
            raise BadInput(f"the price of {g} must be a non-negative $ per GPU-hour, got {price}")
