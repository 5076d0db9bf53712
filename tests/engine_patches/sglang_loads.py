"""The tp-8 loads of converted checkpoints by SGLang 0.5.23's own classes that test_int4_sglang_load.py and
test_expert_formats_sglang_load.py check, run as one tp_load_worker.py run per test run: its parent imports SGLang
once (about 15 s of a loaded 2-core host's CPU) and its 8 forked ranks load every scenario. The ranks' results are
kept in the run's folder beside the checkpoints (int4_checkpoints.cached_checkpoint), named by the
scenarios and the worker's code; a file that finds the other running them waits on the lock."""

import hashlib
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

from engine_patches.launch import PatchOptions, build_command
from tests.engine_patches.int4_checkpoints import built_once, cached_checkpoint, code_hash

WORLD = 8
WORKER = Path(__file__).with_name("tp_load_worker.py")
REGENERATED = ("_g_idx", "_g_idx_sort_indices")
FORMAT_ROWS = 1024  # the expert-format checkpoints: 128 expert rows per rank at tp 8
FORMAT_CHAINS = {  # scenario: (input kind, conversion chain) for test_expert_formats_sglang_load.py
    "glm-bf16-int4-g128": ("glm", ("int4-g128",)),
    "glm-bf16-fp8": ("glm", ("fp8-block128",)),
    "glm-bf16-nvfp4": ("glm", ("nvfp4",)),
    "kimi-fp8-fp8": ("kimi-fp8", ("fp8-block128",)),
    "kimi-int4-fp8": ("kimi-fp8", ("int4-g32", "fp8-block128")),
    "kimi-int4-nvfp4": ("kimi-fp8", ("int4-g32", "nvfp4")),
}


def sglang_args_from_capbench(model: Path) -> list[str]:
    """What `capbench sglang-launch -- --model-path M --tp 8` hands to sglang.launch_server."""
    argv, _ = build_command(PatchOptions(), ["python", "-m", "sglang.launch_server", "--model-path", str(model),
                                             "--tp", str(WORLD)])
    assert argv[1:3] == ["-m", "sglang.launch_server"]
    return argv[3:]


def left_unwritten(result: dict) -> dict:
    return {n: c for n, c in result["unwritten"].items() if not n.endswith(REGENERATED)}


def int4_models() -> dict[str, Path]:
    """The INT4 g32 conversions (of the default 256-row tiny models) test_int4_sglang_load.py loads."""
    return {kind: cached_checkpoint(kind, ("int4-g32",), tp=WORLD) for kind in ("glm", "kimi-fp8")}


def scenarios() -> list[dict]:
    int4 = int4_models()
    out = [{"name": "glm-sglang-defaults", "args": ["--model-path", str(int4["glm"]), "--tp", str(WORLD)]},
           {"name": "glm-capbench", "args": sglang_args_from_capbench(int4["glm"])},
           {"name": "kimi-capbench", "args": sglang_args_from_capbench(int4["kimi-fp8"])}]
    for name, (kind, chain) in FORMAT_CHAINS.items():
        model = cached_checkpoint(kind, chain, moe_inter=FORMAT_ROWS, tp=WORLD)
        out.append({"name": name, "args": sglang_args_from_capbench(model)})
    return out


def tp8_loads() -> list[dict]:
    """Each rank's results, by scenario name (tp_load_worker.py says what they hold)."""
    todo = scenarios()
    code = code_hash(WORKER, WORKER.with_name("forked.py"))
    key = hashlib.sha256(json.dumps(todo).encode() + code.encode()).hexdigest()[:16]
    done = Path(os.environ["CAPBENCH_TEST_CHECKPOINTS"]) / "sglang-loads" / f"{key}.json"

    def build(work: Path) -> None:
        (work / "scenarios.json").write_text(json.dumps(todo))
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        # the eight ranks fork from one process that imported torch and SGLang once (`all`)
        p = subprocess.run([sys.executable, str(WORKER), "all", str(WORLD), str(port), str(work / "scenarios.json"),
                            str(work / "rank{rank}.json")], capture_output=True, text=True, timeout=900)
        assert p.returncode == 0, (p.stdout + p.stderr)[-6000:]
        ranks = [json.loads((work / f"rank{r}.json").read_text()) for r in range(WORLD)]
        (work / done.name).write_text(json.dumps(ranks))

    built_once(done, build)
    return json.loads(done.read_text())
