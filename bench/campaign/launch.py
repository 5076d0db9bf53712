"""Bringing a campaign's deployment up and down: a twin, an already running URL, `capbench sglang-launch` on this
host, or that command through the user's template (ssh, srun, kubectl) with its stop command after.

The server's output goes to a log file that is kept; a server that does not answer /health within the timeout, or
whose launched process exits first (with or without a template's stop command: the template's process must stay in
the foreground while the server runs), fails with the log's last lines. The process group is recorded in the DB
before the health wait, and the server is trusted only while that process lives and its identity matches the
deployment (bench/campaign/own.py). stop() always runs (the campaign calls it in a finally): the stop command, then
SIGTERM to the group, the deployment's grace period, SIGKILL; so Ctrl-C leaves no server behind, and a SIGKILLed
campaign's servers are stopped by the next runner on the DB.
"""

from __future__ import annotations

import os
import shlex
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import httpx

from bench import http
from bench.campaign import guard, own, watchdog
from bench.campaign.spec import DeploymentSpec
from bench.campaign.templates import CONTAINER_PYTHON, Template, runtime
from bench.errors import BadInput
from bench.model import launch as sglang_args
from bench.store import Store
from bench.twin import Target

LOG_TAIL = 20


class LaunchFailed(RuntimeError):
    """The deployment did not come up (or went down): the message ends with the log's last lines."""

    def __init__(self, message: str, log: str = ""):
        super().__init__(message)
        self.log = log


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def tail(path: Path | None, n: int = LOG_TAIL) -> str:
    if path is None or not path.is_file():
        return ""
    return "\n".join(path.read_text(errors="replace").splitlines()[-n:])


def sglang_launch(server: list[str], kv_checksum: str = "off", kv_scales: str | None = None) -> list[str]:
    """`capbench sglang-launch [patch flags] -- <sglang.launch_server arguments>`: SGLang with capbench's patches
    (KV checksums, FP8 KV scales, the INT4 checkpoint's checks and flags) in every SGLang process."""
    patch = ["--kv-checksum", kv_checksum] + (["--kv-scales", str(kv_scales)] if kv_scales else [])
    return ["capbench", "sglang-launch", *patch, "--", *server]


def attention_args(model: str, gpu: str | None, kv_dtype: str, tp: int, flags: list) -> list[str]:
    """`--attention-backend` as a plan's line names it (bench/model/fits/backend.py), unless the flags name one."""
    if not gpu or any(str(f).split("=")[0].startswith("--attention-backend") for f in flags):
        return []
    return ["--attention-backend", sglang_args.attention_backend(model, gpu, kv_dtype, tp)]


def needs_patches(dep: DeploymentSpec) -> bool:
    """Whether the launch needs capbench's SGLang patches or its launcher: a KV checksum, FP8 KV scales, expert
    weights other than the checkpoint's own, or a secret flag given as env:NAME (filled in by the launcher)."""
    s = dep.sglang
    return (dep.kv_checksum != "off" or bool(s.get("kv_scales")) or dep.weights != "native"
            or any("env:" in str(f) for f in s.get("flags", [])))


def launch_command(dep: DeploymentSpec, port: int, host: str = "127.0.0.1", python: str | None = None) -> list[str]:
    """`capbench sglang-launch [patch flags] -- <sglang.launch_server arguments>` for an sglang deployment; with a
    named interpreter (`python:`), `PYTHON -m sglang.launch_server <arguments>` where no patch is needed, else
    `PYTHON -m bench.cli sglang-launch ...` (capbench installed beside that SGLang)."""
    s = dep.sglang
    path = s.get("model_path") or sglang_args.model_path(dep.model, dep.weights, dep.gpus)[0]
    server = ["--model-path", str(path), "--tp", str(dep.gpus), "--kv-cache-dtype",
              sglang_args.KV_FLAGS[dep.kv_dtype], "--host", host, "--port", str(port), "--enable-metrics",
              "--trust-remote-code"]
    for key, flag in (("dp", "--dp"), ("ep", "--ep")):
        if s.get(key):
            server += [flag, str(s[key])]
    server += attention_args(dep.model, dep.gpu, dep.kv_dtype, dep.gpus, s.get("flags", []))
    if python and not needs_patches(dep):
        return [python, "-m", "sglang.launch_server", *server, *s.get("flags", [])]
    cmd = sglang_launch([*server, *s.get("flags", [])], dep.kv_checksum, s.get("kv_scales"))
    return [python, "-m", "bench.cli", *cmd[1:]] if python else cmd


class Launched:
    """A deployment that is up: its URL, and how to bring it down."""

    def __init__(self, dep: DeploymentSpec, log_dir: Path, store: Store | None = None, cid: str = ""):
        self.dep, self.url = dep, ""
        self.store, self.cid = store, cid
        self.expected: dict = {}
        self.proc: subprocess.Popen | None = None
        self.target: Target | None = None
        self.log: Path | None = None
        self.stop_command: str | None = None
        self.log_dir = log_dir

    def start(self, interrupted: Callable[[], bool] = lambda: False) -> None:
        dep = self.dep
        if dep.kind == "twin":
            try:
                self.target = Target(dep.twin)
            except BadInput as e:
                raise LaunchFailed(f"the twin did not start: {e}") from None
            self.url = self.target.url
            return
        if dep.kind == "url":
            self.url = dep.url
            self.wait_healthy(interrupted)
            return
        host = dep.template.host if dep.template else "127.0.0.1"
        port = int(dep.sglang.get("port") or (free_port() if host in ("127.0.0.1", "localhost") else 30000))
        python, image = runtime(dep)
        cmd = launch_command(dep, port, "0.0.0.0" if dep.template else "127.0.0.1", python)
        fill = {"python": shlex.quote(python or CONTAINER_PYTHON), "image": shlex.quote(image or "")}
        self.proc, self.log, self.stop_command = spawn(dep.name, cmd, dep.template, port, host, self.log_dir,
                                                       self.store, self.cid, fill)
        self.url = f"http://{host}:{port}"
        self.expected = {"model": cmd[cmd.index("--model-path") + 1], "tp": dep.gpus, "kv_dtype": dep.kv_dtype}
        self.wait_healthy(interrupted)
        wrong = own.mismatch(self.expected, own.identity(self.url))
        if wrong:
            raise LaunchFailed(f"{dep.name}: {wrong}", tail(self.log))

    def wait_healthy(self, interrupted: Callable[[], bool]) -> None:
        """Until GET /health answers 200, the process exits, or the deployment's health_timeout passes."""
        deadline = time.monotonic() + self.dep.health_timeout_s
        while True:
            if interrupted():
                raise KeyboardInterrupt
            try:
                if http.get(f"{self.url}/health", timeout=5).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            if self.proc is not None and self.proc.poll() is not None:
                raise LaunchFailed(f"{self.dep.name}: the server exited with code {self.proc.returncode} before "
                                   f"{self.url}/health answered", tail(self.log))
            if time.monotonic() > deadline:
                raise LaunchFailed(f"{self.dep.name}: {self.url}/health did not answer within "
                                   f"{self.dep.health_timeout_s:g} s", tail(self.log))
            time.sleep(0.5)

    def exited(self) -> bool:
        """Whether the launched process (or the twin) has exited: polled while a stage runs, so a server that dies
        mid-stage ends the stage within a second or two."""
        return any(p is not None and p.poll() is not None for p in (self.proc, self.target and self.target.proc))

    def alive(self) -> str | None:
        """None while the deployment serves; else why not (a server that died mid-run fails its cell)."""
        if self.proc is not None and self.proc.poll() is not None:
            return f"the server's launched process exited with code {self.proc.returncode}"
        if self.target is not None and self.target.proc.poll() is not None:
            return f"the twin exited with code {self.target.proc.returncode}"
        try:
            http.get(f"{self.url}/health", timeout=10).raise_for_status()
        except httpx.HTTPError as e:
            return f"{self.url}/health no longer answers ({type(e).__name__})"
        if self.expected:
            return own.mismatch(self.expected, own.identity(self.url))
        return None

    def stop(self) -> None:
        """The template's stop command, then the process group capbench started: SIGTERM, the deployment's grace
        period (SGLang's own shutdown goes to the log), SIGKILL. Stops even when the log or the DB is gone."""
        if self.target is not None:
            self.target.close()
        halt(self.proc, self.stop_command, self.log, self.dep.stop_grace_s, self.store, self.cid)


def spawn(name: str, cmd: list[str], template: Template | None, port: int, host: str, log_dir: Path,
          store: Store | None, cid: str, fill: dict | None = None) -> tuple[subprocess.Popen, Path, str | None]:
    """Starts `cmd` (through the template if any) in a process group of its own, its output to a new log named
    after `name`, and records the group in the DB before anything waits on it. Returns (process, log, the
    template's stop command filled in)."""
    log_dir.mkdir(parents=True, exist_ok=True)
    log = log_dir / f"{name.replace('/', '-')}-{int(time.time())}.log"
    launch_id = f"{os.getpid()}-{time.time_ns()}"
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
           **(own.mark(store.path, cid) if store is not None else {}), watchdog.LAUNCH: launch_id}
    stop_command = None
    unsafe = [w for w in cmd if guard.check_word(w) is not None]
    if template and unsafe:  # checked with the campaign already; never filled into a shell command
        raise LaunchFailed(f"{name}: refused to launch: {guard.check_word(unsafe[0])}")
    with log.open("w") as out:
        if template:
            # a template's own python / image (PD nodes name no deployment-level ones)
            fill = {"python": shlex.quote(template.python or CONTAINER_PYTHON),
                    "image": shlex.quote(template.image or ""), **(fill or {}),
                    "command": " ".join(cmd), "port": port, "host": host}  # words without shell characters
            started = template.start.format(**fill)
            stop_command = template.stop.format(**fill) if template.stop else None
            out.write(f"$ {started}\n")
            out.flush()
            proc = subprocess.Popen(started, shell=True, stdout=out, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, env=env, start_new_session=True)
        else:
            out.write(f"$ {shlex.join(cmd)}\n")
            out.flush()
            proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                                    start_new_session=True)
    proc.launch_id = launch_id  # what halt() ends of it once its group is stopped
    if store is not None:
        own.record_server(store, cid, name, proc, stop_command, log)
    return proc, log, stop_command


def halt(proc: subprocess.Popen | None, stop_command: str | None, log: Path | None, grace_s: float,
         store: Store | None, cid: str) -> None:
    """The template's stop command, then the process group: SIGTERM, grace_s, SIGKILL; marked stopped in the DB.
    Stops even when the log or the DB is gone."""
    try:
        out = (log or Path(os.devnull)).open("a")
    except OSError:
        out = open(os.devnull, "a")  # noqa: SIM115 (closed below)
    with out:
        if stop_command:
            own.run_stop_command(stop_command, out)
        if proc is not None:
            own.stop_group(proc.pid, grace_s, lambda line: print(line, file=out, flush=True), proc.poll)
            if (left := watchdog.stop_launch(getattr(proc, "launch_id", ""), grace_s)):
                print(f"capbench: ended {left} process(es) of the launch that had left its process group", file=out,
                      flush=True)
            proc.poll()
    if proc is not None and store is not None:
        try:
            own.server_stopped(store, cid, proc.pid)
        except Exception:  # noqa: BLE001 (the DB went away: the server is stopped all the same)
            pass
