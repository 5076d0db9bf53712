"""What fits: the model and GPU facts (catalog), the attention backend SGLang 0.5.23 runs (backend), SGLang's memory
arithmetic per GPU (capacity: weights, KV pool tokens, sequences at a context), the routed-expert weight formats
(formats: bytes, kernels per GPU arch, checkpoints, accuracy) and a deployment on one line (spec)."""

from bench.model.fits import backend, capacity, catalog, formats, spec
from bench.model.fits.capacity import Capacity, Deployment
from bench.model.fits.spec import Spec, parse_spec

__all__ = ["backend", "capacity", "catalog", "formats", "spec", "Capacity", "Deployment", "Spec", "parse_spec"]
