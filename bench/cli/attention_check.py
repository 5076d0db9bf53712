"""What `capbench sglang-launch --kv-scales` checks before SGLang starts: that every attention backend the server will
run (the ones named, or SGLang 0.5.23's default for the model on this host's GPU) keeps calibrated FP8 KV scales
right (data/attention_backends.yaml, through bench/model/fits/backend.py, the file the planner's launch lines come
from).

Flags are read as SGLang's argparse reads them, prefixes included (`--attention-back x` is --attention-backend): the
same flag names on argparse. A prefix that names one of them uniquely in SGLang's parser, which has every flag of
this one and more, names it here too; SGLang's parser is not imported for it (seconds of imports, torch's among them).
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
from pathlib import Path

from bench.errors import BadInput
from bench.model import backend

FLAGS = ("attention_backend", "decode_attention_backend", "prefill_attention_backend")


def _parsed(sglang_args: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(add_help=False, exit_on_error=False)
    for flag in FLAGS:
        parser.add_argument("--" + flag.replace("_", "-"))
    parser.add_argument("--model-path", "--model")
    parser.add_argument("--tp-size", "--tp", "--tensor-parallel-size", default="1")
    try:
        ns, _ = parser.parse_known_args(sglang_args)
    except (argparse.ArgumentError, SystemExit) as e:
        raise BadInput(f"SGLang's arguments: {e}") from None
    return ns


def _kind(scales_path: str) -> str | None:
    try:
        layout = (json.loads(Path(scales_path).read_text()).get("capbench") or {}).get("layout")
    except (OSError, ValueError, AttributeError):
        return None
    return {"mla": "mla", "mha": "gqa"}.get(layout)


def gpu_arch() -> str | None:
    """This host's GPU architecture as SGLang's backend choice keys it, from nvidia-smi (or rocminfo); None when
    neither finds a GPU."""
    if shutil.which("nvidia-smi"):
        r = subprocess.run(["nvidia-smi", "--query-gpu=compute_cap", "--format=csv,noheader"], capture_output=True,
                           text=True, timeout=30)
        caps = r.stdout.split()
        if r.returncode == 0 and caps:
            major = caps[0].split(".")[0]
            return {"8": "sm80", "9": "sm90", "10": "sm100"}.get(major)
    if shutil.which("rocminfo"):
        r = subprocess.run(["rocminfo"], capture_output=True, text=True, timeout=30)
        if "gfx942" in r.stdout:
            return "gfx942"
    return None


def _hf_config(model_path: str | None) -> dict:
    """The checkpoint's config.json: a local folder, or a snapshot in the Hugging Face cache; {} when neither."""
    if not model_path:
        return {}
    local = Path(model_path).expanduser() / "config.json"
    cached = sorted((Path.home() / ".cache" / "huggingface" / "hub" / f"models--{model_path.replace('/', '--')}"
                     / "snapshots").glob("*/config.json"))
    for path in [local, *cached]:
        try:
            return json.loads(path.read_text())
        except (OSError, ValueError):
            continue
    return {}


def check(kv_scales: str | None, sglang_args: list[str]) -> list[str]:
    """Notes to print; BadInput naming the backends that work when one the server would run gives wrong attention."""
    if not kv_scales:
        return []
    ns = _parsed(sglang_args)
    config = _hf_config(getattr(ns, "model_path", None))
    kind = _kind(kv_scales) or ("mla" if "kv_lora_rank" in config else "gqa" if config else None)
    named = [getattr(ns, f, None) for f in FLAGS]
    arch = None
    if not all(named[1:]) and not named[0]:  # some part of the server runs SGLang's default
        arch = gpu_arch()
        if arch is None:
            raise BadInput("--kv-scales: name --attention-backend (no GPU found here to tell SGLang's default); "
                           f"for MLA (Kimi K2): {', '.join(_working('mla'))}; for GQA (GLM): "
                           f"{', '.join(_working('gqa'))}")
        if kind is None:
            raise BadInput("--kv-scales: the scales file says no layout and the model's config.json is not here: "
                           "name --attention-backend")
        tp = int(ns.tp_size) if str(ns.tp_size).isdigit() and int(ns.tp_size) > 0 else 1
        heads = int(config.get("num_key_value_heads") or config.get("num_attention_heads") or tp)
        default = backend.default_for(kind, arch, (config.get("architectures") or [None])[0], max(1, heads // tp))
        named = [named[0] or default, *named[1:]]
    main = named[0]
    used = {n or main for n in named[1:]} | ({main} if not all(named[1:]) else set())
    notes = []
    for name in sorted(used):
        for k in [kind] if kind else ["mla", "gqa"]:
            if name not in backend.backends():
                raise BadInput(f"--kv-scales with --attention-backend {name}: capbench has not checked that backend's "
                               f"FP8 KV paths; use one of: {', '.join(_working(k, arch))}")
            why = backend.refusal(name, k, arch)
            if why and (kind or k in backend.backend(name).kinds):
                raise BadInput(why)
            if k == "mla" and backend.backend(name).fp8_mla_read == "upcast":
                notes.append(f"{name} upcasts the whole FP8 MLA layer to BF16 on every step (correct with capbench's "
                             f"scales, but slow); an FP8-native reader: {', '.join(_native_mla(arch))}")
    return notes


def _working(kind: str, arch: str | None = None) -> list[str]:
    return [b.name for b in backend.backends().values() if kind in b.kinds and backend.keeps_scales(b, kind)
            and (arch is None or arch in b.archs)]


def _native_mla(arch: str | None) -> list[str]:
    return [n for n in _working("mla", arch) if backend.backend(n).fp8_mla_read != "upcast"]
