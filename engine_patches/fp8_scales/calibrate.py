"""`capbench calibrate-kv-scales`: drive a BF16-KV server started with `--record-kv-amax PATH`, then turn the
per-rank maxima it dumped into a scales file for `--kv-scales` / `--quantization-param-path`.

The maxima travel through files, not HTTP: the recorder lives in SGLang's scheduler processes, which serve no
HTTP, so this command must run on the server's host (or see PATH through a shared filesystem).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
from rich.progress import Progress

from engine_patches.fp8_scales.recorder import read_dumps
from engine_patches.fp8_scales.scales_file import E4M3_MAX, build_scales, merge_rank_dumps, write_scales

DEFAULT_PROMPTS = Path(__file__).resolve().parents[2] / "data" / "prompts" / "kv_calibration.jsonl"


@dataclass
class CalibrationResult:
    out: Path
    layout: str
    layers: int
    ranks: int
    tokens_seen: int
    max_amax: float
    layers_past_e4m3: int  # layers whose K or V maxima exceed 448: scale 1.0 saturates there


def load_prompts(path: str | Path | None) -> list[str]:
    """JSONL with a "prompt" field per line, or plain text with one prompt a line."""
    path = Path(path) if path else DEFAULT_PROMPTS
    if not path.is_file():
        raise ValueError(f"prompt file not found: {path}")
    prompts = []
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        if line.lstrip().startswith("{"):
            try:
                prompts.append(str(json.loads(line)["prompt"]))
            except (json.JSONDecodeError, KeyError) as e:
                raise ValueError(f"{path}:{n}: expected a JSON object with a 'prompt' field ({e})") from e
        else:
            prompts.append(line)
    if not prompts:
        raise ValueError(f"no prompts in {path}")
    return prompts


def _model_name(client: httpx.Client) -> str:
    try:
        data = client.get("/v1/models").json().get("data") or []
        return data[0]["id"] if data else "default"
    except (httpx.HTTPError, ValueError, KeyError):
        return "default"


def _complete(client: httpx.Client, model: str, prompt: str, max_tokens: int) -> None:
    r = client.post("/v1/completions", json={"model": model, "prompt": prompt, "max_tokens": max_tokens,
                                             "temperature": 0})
    if r.status_code != 200:
        raise ValueError(f"{client.base_url}/v1/completions answered {r.status_code}: {r.text[:200]}")


def _wait_for_fresh_dumps(client, model, amax_path, since: float, timeout_s: float) -> list[dict]:
    """Each eager forward may dump; small flush requests make the ranks write a dump newer than `since`."""
    deadline = time.time() + timeout_s
    while True:
        _complete(client, model, "ok", 1)
        dumps = read_dumps(amax_path)
        if dumps and all(d["written_at"] >= since for d in dumps):
            return dumps
        if time.time() > deadline:
            found = ", ".join(f"rank {d['rank']} at {d['written_at']:.0f}" for d in dumps) or "none"
            raise ValueError(f"no fresh amax dumps at {amax_path}.rank*.json after {timeout_s:.0f}s (found: {found}); "
                             "was the server started with --record-kv-amax on this path, on this host?")
        time.sleep(0.5)


def calibrate(
    target: str,
    amax_path: str | Path,
    out: str | Path,
    prompts_path: str | Path | None = None,
    margin: float = 1.0,
    max_tokens: int = 16,
    tp_size: int | None = None,
    num_layers: int | None = None,
    model_type: str | None = None,
    timeout_s: float = 60.0,
) -> CalibrationResult:
    if margin < 1.0:
        raise ValueError(f"--margin must be >= 1.0 (headroom above the calibrated maximum), got {margin}")
    prompts = load_prompts(prompts_path)
    with httpx.Client(base_url=target.rstrip("/"), timeout=httpx.Timeout(300.0, connect=5.0)) as client:
        try:
            model = _model_name(client)
            with Progress() as progress:
                task = progress.add_task("calibration prompts", total=len(prompts))
                for p in prompts:
                    _complete(client, model, p, max_tokens)
                    progress.advance(task)
            since = time.time()
            dumps = _wait_for_fresh_dumps(client, model, amax_path, since, timeout_s)
        except httpx.HTTPError as e:
            raise ValueError(f"cannot reach {target}: {e}") from e
    layout, amax = merge_rank_dumps(dumps)
    drafts = {layer for d in dumps for layer in d.get("draft_layers", [])}
    layers = num_layers or (max(set(amax) - drafts) + 1)
    ranks = tp_size or len(dumps)
    doc = build_scales(layout, amax, layers, ranks, margin, model_type)
    path = write_scales(doc, out)
    tokens = sum(int(d["layers"][min(d["layers"], key=int)].get("tokens", 0)) for d in dumps if d["layers"])
    return CalibrationResult(
        out=path, layout=layout, layers=layers, ranks=ranks, tokens_seen=tokens,
        max_amax=max(max(k, v) for k, v in amax.values()),
        layers_past_e4m3=sum(1 for k, v in amax.values() if max(k, v) > E4M3_MAX),
    )
