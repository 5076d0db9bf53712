"""--price as `capbench plan` and `capbench report` take it: one figure for --gpu ('3.10'), or one per GPU named
('h200=3.10,b200=5.20'). A GPU searched without a price of its own stays at the catalog's indicative price, and
the first screen says which (wording.prices)."""

from __future__ import annotations

from bench import checks
from bench.errors import BadInput

SYNTAX = "a $ per GPU-hour for --gpu (3.10) or one per GPU (h200=3.10,b200=5.20)"


def parse_price(text: str | None, gpu: str) -> dict:
    """Question's price fields: {'price_per_gpu_hour': ..., 'gpu_prices': ((gpu, price), ...)}."""
    if text is None or not text.strip():
        return {"price_per_gpu_hour": None, "gpu_prices": ()}
    if "=" not in text:
        return {"price_per_gpu_hour": _dollars(text, "--price"), "gpu_prices": ()}
    given: dict[str, float] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        name, sep, value = part.partition("=")
        name = name.strip().lower()
        if not sep or not name:
            raise BadInput(f"bad --price part {part!r}; expected {SYNTAX}")
        if name in given:
            raise BadInput(f"--price names {name} twice")
        given[name] = _dollars(value, f"--price {name}")
    return {"price_per_gpu_hour": given.pop(gpu, None), "gpu_prices": tuple(given.items())}


def _dollars(value: str, where: str) -> float:
    try:
        price = float(value.strip().removeprefix("$"))
    except ValueError:
        raise BadInput(f"{where}: {value.strip()!r} is not a $ per GPU-hour; expected {SYNTAX}") from None
    checks.number(where, price, low=0, high=1e6, above=True)  # as every other number a command takes
    return price


def prices_json(q) -> dict:  # noqa: ANN001 (a bench.model Question)
    """--json's question.prices: every GPU asked about or searched, its $ per GPU-hour and whether it was given."""
    from bench.model import prices

    return {g: {"usd_per_gpu_hour": p, "given": given} for g, (p, given) in prices.costed(q).items()}
