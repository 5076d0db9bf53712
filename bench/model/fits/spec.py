"""A deployment written on one line: `MODEL[@GPUxN][,key=value...]`, e.g. `kimi-k2-thinking@h200x8,kv=fp8_e4m3`.

The same spec names a twin target (`twin:SPEC`, whose keys also set the twin's own options such as time_scale),
the deployment a real server ran (`capbench calibrate --deployment`), and a run's deployment in the store.
Keys are written with - or _; `kv` stands for kv_dtype, `scale` for time_scale, `name` for served_model_name.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from bench.errors import BadInput
from bench.model.fits import catalog
from bench.model.fits.capacity import Deployment

ALIASES = {"kv": "kv_dtype", "scale": "time_scale", "name": "served_model_name"}
# The keys that describe the deployment itself, and how their values read.
DEPLOYMENT_KEYS = {"dp": int, "kv_dtype": str, "weights": str, "context": int, "mem_fraction": float,
                   "page_size": int, "mtp": bool}
SYNTAX = "MODEL[@GPUxN][,key=value...], e.g. kimi-k2-thinking@h200x8,kv=fp8_e4m3"


@dataclass(frozen=True)
class Spec:
    text: str
    model: str
    gpu: str = "h200"
    tp: int = 8
    options: dict[str, str] = field(default_factory=dict)  # key=value pairs, keys normalised

    def value(self, key: str, kind: type, default: object = None) -> object:
        """The option `key` read as `kind` (int, float, bool or str); `default` when absent."""
        if key not in self.options:
            return default
        raw = self.options[key].strip()
        try:
            if kind is bool:
                return raw.lower() in ("1", "true", "yes", "on")
            return kind(raw)
        except ValueError:
            raise BadInput(f"spec '{self.text}': bad value for {key}: '{raw}'") from None

    def deployment(self) -> Deployment:
        values = {key: self.value(key, kind) for key, kind in DEPLOYMENT_KEYS.items() if key in self.options}
        return Deployment(catalog.model(self.model), catalog.gpu(self.gpu), self.tp, **values)


def parse_spec(text: str, known: set[str] | None = None) -> Spec:
    """'twin:MODEL@GPUxN,k=v,...' (the twin: prefix is optional). `known`: the keys allowed (default: any)."""
    body = text.removeprefix("twin:")
    head, *opts = body.split(",")
    model, _, where = head.strip().partition("@")
    if not model:
        raise BadInput(f"spec '{text}': expected {SYNTAX}")
    values: dict = {"model": model}
    if where:
        gpu, _, count = where.rpartition("x")
        if not gpu or not count.isdigit():
            raise BadInput(f"spec '{text}': expected GPUxN after @, e.g. h200x8")
        values.update(gpu=gpu, tp=int(count))
    options = {}
    for opt in filter(None, (o.strip() for o in opts)):
        key, sep, val = opt.partition("=")
        key = ALIASES.get(key.strip(), key.strip().replace("-", "_"))
        if not sep or key == "model" or (known is not None and key not in known):
            valid = f"; valid: {', '.join(sorted(known))}" if known is not None else ""
            raise BadInput(f"spec '{text}': unknown option '{opt}'{valid}")
        options[key] = val
    return Spec(text, options=options, **values)
