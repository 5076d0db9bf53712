"""Bringing a disaggregated deployment up and down: every node of every prefill and decode instance (SGLang's
`--disaggregation-mode prefill|decode`), each through its node's template, then the router
(`sglang_router.launch_router --pd-disaggregation`) pointed at them; the campaign's load goes to the router.

Each launch is recorded in the DB before anything waits on it (bench/campaign/launch.spawn), so a SIGKILLed
campaign's next runner stops every role's processes. Prefill and decode are waited for together: the first launch
whose process exits fails the deployment within half a second, naming its role; each instance's first node must
then say it is that role, with the deployment's tp and KV dtype (own.identity), or the cell fails with both
identities. Stopping goes router first, then decode, then prefill, each SIGTERM, stop_grace, SIGKILL.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from bench import http
from bench.campaign import own
from bench.campaign.launch import LaunchFailed, attention_args, free_port, halt, sglang_launch, spawn, tail
from bench.campaign.pd_spec import PDSpec, Role, nodes_per_instance
from bench.campaign.spec import DeploymentSpec
from bench.campaign.templates import Template
from bench.model import launch as sglang_args
from bench.model.pd import disagg
from bench.model.pd import launch as disagg_launch
from bench.store import Store


@dataclass
class Part:
    """One launch: a node of an instance of a role (the first node of an instance serves its HTTP port)."""

    label: str  # prefill[0], decode[1].node1, router
    role: str
    argv: list[str]
    template: Template | None
    host: str
    port: int
    serves: bool  # the instance's first node (or the router): answers /health at url
    expected: dict = field(default_factory=dict)
    workers: dict = field(default_factory=dict)  # the router: role -> the instance URLs it is given, sorted
    proc: subprocess.Popen | None = None
    log: Path | None = None
    stop_command: str | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"


ROUTER_WORKERS_S = 30.0  # how long the router may take to list every launched instance after its /health answers


class Ports:
    """Ports per host: given ones count up from the role's `port`; otherwise a free one on this host, and from
    SGLang's defaults up on a remote node (two instances on one node get different ports)."""

    def __init__(self, free: Callable[[], int] = free_port) -> None:
        self.next: dict[tuple[str, int], int] = {}
        self.free = free

    def take(self, host: str, given: int | None, index: int, default: int) -> int:
        if given:
            return given + index
        if host in ("127.0.0.1", "localhost"):
            return self.free()
        port = self.next.get((host, default), default)
        self.next[(host, default)] = port + 1
        return port


def plan(dep: DeploymentSpec, free: Callable[[], int] = free_port) -> list[Part]:
    """Every prefill node, every decode node, then the router, with the command each runs (`free`: a free port of
    this host; the check passes one that binds nothing)."""
    pd = dep.pd
    ports = Ports(free)
    parts: list[Part] = []
    urls: dict[str, list[str]] = {"prefill": [], "decode": []}
    for role in (pd.prefill, pd.decode):
        per = nodes_per_instance(role, dep.gpu)
        for i in range(role.count):
            first = _place(pd, role, i * per)
            port = ports.take(first[1], role.port, i, disagg_launch.PORT)
            boot = (ports.take(first[1], role.bootstrap_port, i, disagg_launch.BOOTSTRAP_PORT)
                    if role.role == "prefill" else None)
            dist = f"{first[1]}:{ports.take(first[1], None, i, disagg_launch.DIST_PORT)}" if per > 1 else None
            for rank in range(per):
                template, host = _place(pd, role, i * per + rank)
                argv = server_command(dep, role, port, boot, "0.0.0.0" if template else "127.0.0.1")
                if per > 1:
                    argv += ["--nnodes", str(per), "--node-rank", str(rank), "--dist-init-addr", dist]
                label = f"{role.role}[{i}]" + (f".node{rank}" if per > 1 else "")
                part = Part(label, role.role, argv, template, host, port, rank == 0)
                if rank == 0:
                    part.expected = {"mode": role.role, "model": argv[argv.index("--model-path") + 1],
                                     "tp": role.tp, "kv_dtype": dep.kv_dtype}
                    urls[role.role].append(part.url + (f" {boot}" if boot else ""))
                parts.append(part)
    template, host = _place(pd, pd.router, 0)
    port = ports.take(host, pd.router.port, 0, disagg_launch.ROUTER_PORT)
    argv = router_command(urls["prefill"], urls["decode"], port, "0.0.0.0" if template else "127.0.0.1",
                          list(pd.router.flags))
    workers = {r: sorted(u.split()[0] for u in urls[r]) for r in urls}
    parts.append(Part("router", "router", argv, template, host, port, True, workers=workers))
    return parts


def _place(pd: PDSpec, role: Role, k: int) -> tuple[Template | None, str]:
    """The template and host of the role's k-th launch."""
    if not role.nodes:
        return None, "127.0.0.1"
    node = role.nodes[k if len(role.nodes) > 1 else 0]
    t = pd.nodes.get(node)
    return t, t.host if t else "127.0.0.1"


def patched(dep: DeploymentSpec, role: Role) -> bool:
    """Whether the role's launch needs capbench's launcher: KV checksums, FP8 KV scales, INT4 experts, or a secret
    flag given as env:NAME (filled in inside the server's process, as a colocated launch's is)."""
    return (dep.kv_checksum != "off" or bool(dep.pd.kv_scales) or dep.weights.startswith("int4")
            or any("env:" in f for f in role.flags))


def server_command(dep: DeploymentSpec, role: Role, port: int, bootstrap: int | None, bind: str) -> list[str]:
    """`python -m sglang.launch_server` for one node of a prefill or decode instance (as bench/model/
    disagg_launch.py writes it for a plan), through `capbench sglang-launch` when the deployment asks for patches
    (as a colocated launch is: bench/campaign/launch.py)."""
    pd = dep.pd
    path = pd.model_path or sglang_args.model_path(dep.model, dep.weights, role.tp)[0]
    argv = ["--model-path", path, "--trust-remote-code",
            "--disaggregation-mode", role.role, "--disaggregation-transfer-backend", pd.transfer,
            "--tp", str(role.tp), "--kv-cache-dtype", sglang_args.KV_FLAGS[dep.kv_dtype], "--host", bind,
            "--port", str(port), "--enable-metrics"]
    if role.dp > 1:
        argv += ["--dp", str(role.dp), "--enable-dp-attention"]
    if role.ep > 1:
        argv += ["--ep", str(role.ep)]
    if bootstrap is not None:
        argv += ["--disaggregation-bootstrap-port", str(bootstrap)]
    argv += attention_args(dep.model, dep.gpu, dep.kv_dtype, role.tp, list(role.flags))
    if "--mem-fraction-static" not in {f.split("=")[0] for f in role.flags}:  # as the PD model and plan assume
        argv += ["--mem-fraction-static", f"{disagg.pd_mem_fraction(dep.model, dep.gpu):.3f}"]
    argv += list(role.flags)
    if patched(dep, role):
        return sglang_launch(argv, dep.kv_checksum, pd.kv_scales)
    return ["python", "-m", "sglang.launch_server", *argv]


def router_command(prefill: list[str], decode: list[str], port: int, bind: str, flags: list[str]) -> list[str]:
    argv = ["python", "-m", "sglang_router.launch_router", "--pd-disaggregation"]
    for p in prefill:
        argv += ["--prefill", *p.split()]
    for d in decode:
        argv += ["--decode", d]
    return [*argv, "--host", bind, "--port", str(port), *flags]


class PDLaunched:
    """A disaggregated deployment that is up: the router's URL, and how to bring every role down
    (the interface of launch.Launched, which the campaign's runner uses)."""

    def __init__(self, dep: DeploymentSpec, log_dir: Path, store: Store | None = None, cid: str = ""):
        self.dep, self.log_dir, self.store, self.cid = dep, log_dir, store, cid
        self.parts: list[Part] = []
        self.url = ""
        self.log: Path | None = None  # the log of the role that failed, else the router's

    def start(self, interrupted: Callable[[], bool] = lambda: False) -> None:
        planned = plan(self.dep)
        servers, router = planned[:-1], planned[-1]
        for part in servers:
            self._spawn(part)
        self._wait([p for p in servers if p.serves], interrupted)
        for part in servers:
            if part.serves and (wrong := own.mismatch(part.expected, own.identity(part.url))):
                self.log = part.log
                raise LaunchFailed(f"{self.dep.name}: {part.label} at {part.url}: {wrong}", tail(part.log))
        self._spawn(router)
        self._wait([router], interrupted)
        self._check_router(router)
        self.url, self.log = router.url, router.log

    def _check_router(self, router: Part) -> None:
        """The router must route to exactly the launched instances. sglang-router adds its workers in the background
        after it answers /health, so its list is read until it matches, for up to ROUTER_WORKERS_S (within the
        health timeout); a router that lists no workers is judged by its process alone."""
        deadline = time.monotonic() + min(self.dep.health_timeout_s, ROUTER_WORKERS_S)
        while (got := router_workers(router.url)) is not None and got != router.workers:
            if time.monotonic() > deadline:
                self.log = router.log

                def said(w: dict) -> str:
                    return f"prefill {', '.join(w['prefill']) or 'none'}; decode {', '.join(w['decode']) or 'none'}"

                raise LaunchFailed(f"{self.dep.name}: the router at {router.url} routes to {said(got)}; launched "
                                   f"{said(router.workers)}", tail(router.log))
            time.sleep(0.5)

    def _spawn(self, part: Part) -> None:
        part.proc, part.log, part.stop_command = spawn(f"{self.dep.name}/{part.label}", part.argv, part.template,
                                                       part.port, part.host, self.log_dir, self.store, self.cid)
        self.parts.append(part)

    def _wait(self, parts: list[Part], interrupted: Callable[[], bool]) -> None:
        """Until every part's /health answers 200; the first launch (of any role) that exits, or the deployment's
        health_timeout, fails it with that role's log."""
        deadline = time.monotonic() + self.dep.health_timeout_s
        waiting = list(parts)
        while waiting:
            if interrupted():
                raise KeyboardInterrupt
            if (gone := self._exited()) is not None:
                self.log = gone.log
                raise LaunchFailed(f"{self.dep.name}: the {gone.label} server exited with code "
                                   f"{gone.proc.returncode} before {gone.url}/health answered", tail(gone.log))
            waiting = [p for p in waiting if not _healthy(p.url)]
            if waiting and time.monotonic() > deadline:
                self.log = waiting[0].log
                raise LaunchFailed(f"{self.dep.name}: {', '.join(p.label for p in waiting)} did not answer /health "
                                   f"within {self.dep.health_timeout_s:g} s", tail(waiting[0].log))
            if waiting:
                time.sleep(0.5)

    def _exited(self) -> Part | None:
        return next((p for p in self.parts if p.proc is not None and p.proc.poll() is not None), None)

    def exited(self) -> bool:
        """Whether any role's launched process has exited (polled while a stage runs)."""
        return self._exited() is not None

    def alive(self) -> str | None:
        """None while every role serves; else which role is down and why."""
        if (gone := self._exited()) is not None:
            self.log = gone.log
            return f"the {gone.label} server's launched process exited with code {gone.proc.returncode}"
        for part in (p for p in self.parts if p.serves):
            if not _healthy(part.url):
                self.log = part.log
                return f"the {part.label} server at {part.url}/health no longer answers"
            if part.expected and (wrong := own.mismatch(part.expected, own.identity(part.url))):
                return f"{part.label}: {wrong}"
        return None

    def stop(self) -> None:
        """Router first, then decode, then prefill (the reverse of the launch order): each the template's stop
        command, then SIGTERM to its process group, stop_grace, SIGKILL."""
        for part in reversed(self.parts):
            halt(part.proc, part.stop_command, part.log, self.dep.stop_grace_s, self.store, self.cid)


def router_workers(url: str) -> dict[str, list[str]] | None:
    """The prefill and decode URLs the router says it routes to, sorted (sglang-router's GET /workers:
    {"workers": [{"url": ..., "worker_type": "prefill" | "decode" | ...}, ...]}); None when it lists none so."""
    try:
        r = http.get(f"{url}/workers", timeout=10)
        body = r.json() if r.status_code == 200 else None
    except (httpx.HTTPError, ValueError):
        return None
    if not isinstance(body, dict) or not isinstance(body.get("workers"), list):
        return None
    out: dict[str, list[str]] = {"prefill": [], "decode": []}
    for w in (w for w in body["workers"] if isinstance(w, dict)):
        kind = str(w.get("worker_type", "")).lower()  # "prefill", or a tagged form that names it
        role = next((r for r in out if r in kind), None)
        if role:
            out[role].append(str(w.get("url", "")).rstrip("/"))
    return {r: sorted(u) for r, u in out.items()}


def _healthy(url: str) -> bool:
    try:
        return http.get(f"{url}/health", timeout=5).status_code == 200
    except httpx.HTTPError:
        return False
