"""Model-written code runs here and nowhere else: a subprocess per program in a jail (bench/eval/jail.py: its own
mount, network, PID and IPC namespaces, a read-only view of the interpreter and the paths asked for, a writable
tmpfs as its folder, no privilege, CPU / memory / file / process limits) with an empty environment, a new session
and a wall-clock timeout. What cannot be contained is not run: where the jail cannot be built (not Linux, no
namespaces), `why_not` says why and every program comes back `not_run`, never scored.
"""

from __future__ import annotations

import functools
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

JAIL = Path(__file__).with_name("jail.py")
CANNOT = 97  # the jail's exit code when it could not be built (jail.py)


@dataclass(frozen=True)
class Limits:
    cpu_s: int = 10
    wall_s: float = 20.0
    memory_mb: int = 1024
    work_mb: int = 16  # the tmpfs the program may write, and the largest file
    processes: int = 32

    def job(self, program: str, paths: tuple[str, ...], args: tuple[str, ...] = ()) -> dict:
        return {"program": program, "paths": list(paths), "args": list(args), "cpu_s": self.cpu_s,
                "wall_s": self.wall_s, "memory_bytes": self.memory_mb << 20, "work_bytes": self.work_mb << 20,
                "processes": self.processes}


@dataclass
class Outcome:
    status: str  # passed (exit 0) | failed (non-zero exit) | timeout | not_run (the jail could not be built)
    code: int | None
    stdout: str
    stderr: str
    wall_s: float

    @property
    def detail(self) -> str:
        """The program's last words, one line: what a failure looked like."""
        lines = [x for x in self.stderr.strip().splitlines() if x.strip()]
        return (lines[-1] if lines else f"exit {self.code}")[:300]


def _python() -> str:
    return os.path.realpath(sys.executable)


def start(program: str, paths: tuple[str, ...] = (), limits: Limits = Limits(), args: tuple[str, ...] = ()
          ) -> subprocess.Popen:
    """The jail started with `program`, its stdin and stdout open as pipes (for a program that answers in turns)."""
    proc = subprocess.Popen([_python(), "-I", "-S", "-B", str(JAIL)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env={}, cwd="/", start_new_session=True)
    proc.stdin.write((json.dumps(limits.job(program, paths, args)) + "\n").encode())
    proc.stdin.flush()
    return proc


def stop(proc: subprocess.Popen) -> None:
    """Kill the jail's session (its PID namespace ends with it) and reap it."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    proc.wait()


def run(program: str, paths: tuple[str, ...] = (), limits: Limits = Limits(), stdin: str = "",
        args: tuple[str, ...] = ()) -> Outcome:
    """Run `program` (with `args` as its sys.argv[1:]) in the jail to its end, its limits or its wall-clock
    timeout."""
    if (why := why_not()) is not None:
        return Outcome("not_run", None, "", why, 0.0)
    return _run(program, paths, limits, stdin, args)


def _run(program: str, paths: tuple[str, ...], limits: Limits, stdin: str, args: tuple[str, ...] = ()) -> Outcome:
    began = time.monotonic()
    proc = start(program, paths, limits, args)
    try:
        out, err = proc.communicate(stdin.encode(), timeout=limits.wall_s + 5)
    except subprocess.TimeoutExpired:
        stop(proc)
        return Outcome("timeout", None, "", "", time.monotonic() - began)
    wall = time.monotonic() - began
    text, err_text = out.decode(errors="replace")[-20_000:], err.decode(errors="replace")[-4_000:]
    if proc.returncode == CANNOT and err_text.startswith("sandbox:"):
        return Outcome("not_run", CANNOT, text, err_text.strip(), wall)
    if proc.returncode == 128 + signal.SIGKILL and wall >= limits.wall_s:
        return Outcome("timeout", proc.returncode, text, err_text, wall)
    return Outcome("passed" if proc.returncode == 0 else "failed", proc.returncode, text, err_text, wall)


@functools.cache
def why_not() -> str | None:
    """Why programs cannot be contained on this host (None: they can): a probe runs in the jail once."""
    if not sys.platform.startswith("linux"):
        return f"the sandbox needs Linux namespaces; this is {sys.platform}: code is not run"
    probe = _run("print('contained')", (), Limits(cpu_s=5, wall_s=30), "")
    if probe.status == "passed" and probe.stdout.strip() == "contained":
        return None
    return f"the sandbox cannot be built here ({probe.detail}): code is not run"
