"""The twin: an HTTP server that answers like SGLang 0.5.23 serving a chosen model on chosen GPUs, with model/'s
capacity, scheduler and step times played in real time (divided by time_scale).

config   TwinConfig, and the `twin:MODEL@GPUxN,key=value` spec that names one
server   the engine loop and SGLang's HTTP API over it
api      OpenAI request parsing and response bodies
metrics  SGLang's Prometheus /metrics
text     the deterministic tokenizer and the synthetic answers
serve    serving a twin: in this process, or on a background thread
pd       a prefill/decode-disaggregated deployment as one twin (prefill_tp=N)
process  a run's target: a URL, or a twin in a process of its own
"""

from bench.twin.config import TwinConfig, parse_twin_spec, pd_shape
from bench.twin.process import Target
from bench.twin.serve import TwinHandle, own_process, serve_forever, serve_in_thread
from bench.twin.server import Twin

__all__ = ["TwinConfig", "parse_twin_spec", "pd_shape", "Target", "TwinHandle", "own_process", "serve_forever",
           "serve_in_thread", "Twin"]
