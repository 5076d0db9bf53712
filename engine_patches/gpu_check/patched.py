"""What a GPU check needs of a server's process around SGLang's code, for the length of the check only:

- capbench's FP8-scale patches on SGLang's classes, as `capbench sglang-launch --kv-scales` installs them
  (fp8_scales/loading.py's MLA pool scaling, fp8_scales/backends.py's backend wrappers); the classes get their own
  methods back on exit, so a test process that runs the check in-process sees SGLang unpatched afterwards;
- SGLang's runtime config (get_exec(), get_parallel(): the MoE config lookup and the MLA pool read them) at a
  server's defaults (ServerArgs with no flags, one rank, no decode context parallelism), in a context of its own
  (runtime_context.use_context) that is left on exit."""

from __future__ import annotations

from contextlib import contextmanager

from engine_patches.fp8_scales import backends as scaled
from engine_patches.fp8_scales import loading

MISSING = object()


class Patches:
    def __init__(self) -> None:
        self.saved: list[tuple[type, str, object]] = []
        self.scales: dict[int, float] = {}

    def _save(self, cls: type, name: str) -> None:
        self.saved.append((cls, name, cls.__dict__.get(name, MISSING)))

    def __enter__(self) -> Patches:
        from sglang.srt.mem_cache.memory_pool import MLATokenToKVPool

        for name in ("set_mla_kv_buffer", "get_mla_kv_buffer"):
            self._save(MLATokenToKVPool, name)
        self.scales = dict(loading.MLA_SCALES)
        loading.install_mla_pool_scaling()
        return self

    def method(self, cls: type, name: str):
        """cls.<name> with capbench's wrapper on the class that defines it, where backends.PATCHES has one."""
        for klass in cls.__mro__:
            for module, class_name, wrappers in scaled.PATCHES:
                if (klass.__module__, klass.__name__) != (module, class_name):
                    continue
                for method in wrappers:
                    if not getattr(klass.__dict__.get(method), "_capbench_scales", True):
                        self._save(klass, method)
                scaled.install_class(klass, wrappers)
        return getattr(cls, name)

    def __exit__(self, *exc) -> None:
        for cls, name, value in reversed(self.saved):
            if value is MISSING:
                delattr(cls, name)
            else:
                setattr(cls, name, value)
        self.saved.clear()
        loading.MLA_SCALES.clear()
        loading.MLA_SCALES.update(self.scales)


@contextmanager
def sglang_runtime():
    from sglang.srt import runtime_context as rc
    from sglang.srt.server_args import ServerArgs

    if rc.get_context().is_config_namespace_published("exec"):  # inside a server, or a test that published one
        yield
        return
    context = rc.RuntimeContext(parallel=rc.ParallelContext())
    context.set_server_args(ServerArgs(model_path="capbench-gpu-check"))  # its defaults; no model is read
    with rc.use_context(context), rc.get_parallel().override(dcp_enabled=False, attn_dcp_size=1, attn_dcp_rank=0):
        yield
