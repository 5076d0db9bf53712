"""Locust users for OpenAI-compatible servers (chat and completions, streaming or not).

Every request ends in exactly one result record, fired through Locust's own `events.request` with the record in
`context["capbench"]` (whoever runs Locust decides where records go; this package knows nothing of the store).

Timing, one clock: timestamps are `time.time()` (epoch seconds, the clock the store and the twin use); durations
are `perf_counter()` deltas added to the send timestamp. Latencies (ttft_s, e2e_s) count from `scheduled_at`,
the time the request was due, so a client that falls behind shows up as latency; `dispatch_lag_s = sent_at -
scheduled_at` says by how much. Under a concurrency cap (max_concurrency) they count from when the request got its
slot, as sglang.bench_serving's do, and `slot_wait_s` is the wait for it. The first token is the first chunk that
carries content, reasoning or a tool call.

Requests go straight to geventhttpclient's HTTPClient of the user's pool, not through FastHttpSession: it would
retry, fire its own event when the headers arrive, and hide the stream.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from urllib.parse import urlparse

import gevent
import numpy as np
from gevent import GreenletExit
from gevent.event import Event
from geventhttpclient._parser import HTTPParseError
from geventhttpclient.client import HTTPClientPool
from geventhttpclient.response import HTTPConnectionClosed
from geventhttpclient.url import URL
from locust import task
from locust.contrib.fasthttp import FastHttpUser

from loadgen import cancel, profiles, prompt_file, sessions, workloads
from loadgen.redact import redact
from loadgen.responses import EVENT_MAX_BYTES, RequestFailed, Stream
from loadgen.timing import Slots, _slots, clock_pair, wait_until  # noqa: F401  (their home was here)

# a nested profile's warm-up sends the workload's requests from here on: never a measured one, but of the same
# seed (a shared system prompt is as warm as it would be in a long run)
WARMUP_INDEX = 10**9

try:  # optional: faster than json; same results
    from orjson import dumps as _dumps
except ImportError:
    def _dumps(obj) -> bytes:
        return json.dumps(obj).encode()

CONFIG_OPTION = "capbench"  # environment.parsed_options.capbench: the run's config as JSON (reaches workers too)
ERROR_TEXT_MAX = 300
API_PATHS = {"chat": "/v1/chat/completions", "completions": "/v1/completions", "embeddings": "/v1/embeddings"}
SERVER_ID_HEADER = "X-Capbench-Request-Id"  # the twin's id of a request: its server-side timestamps are at
# GET /capbench/requests/{id}; travels in the Locust event's context, not in the record


class _Deadline(Exception):
    pass


@dataclass
class Plan:
    """One process's share of a run, built from the run's config: the schedule, the workload, the target."""

    config: dict
    worker_index: int = 0
    raw: str = ""  # the config's JSON, as it came
    workload: workloads.Workload = field(init=False)
    offsets: list[float] = field(init=False, default_factory=list)
    trace_rows: list[dict] | None = field(init=False, default=None)
    cursor: int = field(init=False, default=0)
    sent: int = field(init=False, default=0)
    recorded: int = field(init=False, default=0)
    inflight: dict = field(init=False, default_factory=dict)  # request_id -> its record so far (sent, not ended)
    stopping: bool = field(init=False, default=False)
    # told as each request goes out; the event it returns is set once the recorder (or the master) has heard
    on_sent: Callable[[dict], Event] | None = field(init=False, default=None)
    on_withdrawn: Callable[[dict], None] | None = field(init=False, default=None)  # announced, then not sent

    def __post_init__(self) -> None:
        c = self.config
        self.workers = int(c.get("workers", 1))
        self.t0 = float(c["t0"])
        self.warmup_s = float(c.get("warmup_s", 0.0))
        self.end_at = self.t0 + float(c.get("duration_s", 0.0))  # closed loop: no new request after this
        self.workload = workloads.from_dict(c["workload"])
        self.sessions = self.workload.closed_loop  # each arrival (or user's turn) is a session of several requests
        workloads.corpus()  # the prompt corpus, built now rather than inside the first timed request
        prof = profiles.Profile(c["profile"]["name"], c["profile"]["type"], dict(c["profile"]["params"]))
        prompt_file.replay(prof, self.workload)
        self.open_loop = prof.open_loop
        self.warm_count = 0
        if self.open_loop:
            offsets = sessions.arrivals(prof.arrivals(int(c.get("seed", 0)), self.warmup_s), self.workload,
                                        "_offsets" in prof.params)
            self.total = len(offsets)
            if prof.nested:  # measured request j is the workload's j whatever the warm-up's count (common requests)
                self.warm_count = int(np.count_nonzero(offsets < self.warmup_s))
            self.offsets = offsets[self.worker_index :: self.workers].tolist()
            if prof.type == "trace" and "_offsets" not in prof.params:
                self.trace_rows = prof.trace_rows()
        self.cursor = 0
        self.slots = _slots(prof.params.get("max_concurrency"), self.workers, self.worker_index)
        self.headers = {"Content-Type": "application/json", "Accept": "text/event-stream, application/json"}
        for name, env in (c.get("headers_env") or {}).items():  # --header NAME=env:VAR: read in every process
            self.headers[name] = os.environ.get(env, "")
        self.extra_body = dict(c.get("extra_body") or {})
        self.cancel, self.seed = c.get("cancel"), int(c.get("seed", 0))  # --cancel: loadgen/cancel.py
        self.route = c.get("route", "round-robin")
        self.rr = 0
        key_env = c.get("api_key_env")
        self.secret = os.environ.get(key_env, "") if key_env else ""
        if self.secret:
            self.headers["Authorization"] = f"Bearer {self.secret}"
        self.event_max = int(c.get("event_max_bytes", EVENT_MAX_BYTES))
        self.model = c["model"]
        self.stream = bool(c.get("stream", True))
        self.timeout_s = float(c.get("timeout_s", 600.0))
        self.pool = HTTPClientPool(concurrency=int(c.get("connections", 1024)), insecure=bool(c.get("insecure")),
                                   connection_timeout=float(c.get("connect_timeout_s", 10.0)),
                                   network_timeout=float(c.get("read_timeout_s", 120.0)))
        self.targets = []  # (url, path prefix, client): the target and every --also-target
        for url in [c["target"], *(c.get("targets") or [])]:
            u = urlparse(url)
            host = f"{u.scheme}://{u.netloc}"
            self.targets.append((url, u.path.rstrip("/").removesuffix("/v1"), self.pool.get_client(URL(host + "/"))))
        self.prefix, self.http = self.targets[0][1], self.targets[0][2]

    def target_for(self, index: int) -> tuple[str, str, object]:
        """Where request (or session) `index` goes: by session (every turn of a session to one target, a request
        being a session of one), or round robin over this process's requests."""
        if len(self.targets) == 1:
            return self.targets[0]
        if self.route == "session":
            return self.targets[index % len(self.targets)]
        self.rr += 1
        return self.targets[self.rr % len(self.targets)]

    def claim(self) -> tuple[int, float] | None:
        """The next arrival slot of this process: (request index, due time), or None when the schedule is done."""
        if self.stopping or self.cursor >= len(self.offsets):
            return None
        k = self.cursor
        self.cursor += 1
        return k * self.workers + self.worker_index, self.t0 + self.offsets[k]

    def next_index(self) -> int:
        k = self.cursor
        self.cursor += 1
        return k * self.workers + self.worker_index

    def request(self, i: int) -> workloads.RequestSpec:
        row = self.trace_rows[i] if self.trace_rows is not None else None
        if i < self.warm_count:  # a nested profile's warm-up: prompts of their own, never the measured ones
            return self.workload.request(WARMUP_INDEX + i)
        return self.workload.request(i - self.warm_count, row)

    def session(self, i: int) -> sessions.Session | prompt_file.FileSession:
        """Closed-loop session of arrival i (a nested profile's warm-up has sessions of its own)."""
        return self.workload.session(WARMUP_INDEX + i if i < self.warm_count else i - self.warm_count)


def plan_of(environment) -> Plan:
    """The process's plan for the current run (rebuilt when the run's config changes)."""
    raw = getattr(environment.parsed_options, CONFIG_OPTION, None)
    if raw is None:
        raise RuntimeError("no capbench config: set environment.parsed_options.capbench (bench.runner does)")
    plan = getattr(environment, "capbench_plan", None)
    if plan is None or plan.raw != raw:
        runner = environment.runner
        index = max(0, getattr(runner, "worker_index", 0) or 0)
        plan = Plan(json.loads(raw), worker_index=index, raw=raw)
        plan.on_sent = getattr(environment, "capbench_on_sent", None)
        plan.on_withdrawn = getattr(environment, "capbench_on_withdrawn", None)
        plan.stopping = bool(getattr(environment, "capbench_stopping", False))  # a signalled worker sends no more
        environment.capbench_plan = plan
    return plan


class OpenAIUser(FastHttpUser):
    """Sends the plan's requests. Subclasses decide when (closed or open loop)."""

    abstract = True
    host = "http://127.0.0.1"  # the plan's target is what counts

    def on_start(self) -> None:
        self.plan = plan_of(self.environment)

    def send(self, spec: workloads.RequestSpec, index: int, scheduled_at: float | None,
             slot_at: float | None = None, turn: tuple[int, bool] | None = None,
             phase_at: float | None = None) -> dict:
        """Send one request and fire its record; returns the record. slot_at: when a capped run's request got its
        slot; its latencies count from then (bench_serving's clock starts inside its semaphore), and the wait
        before it is slot_wait_s. turn: (turn, last) of closed-loop session `index` (the answer's text is kept
        in self.answer); phase_at: the time that decides warm-up or measured (a session's start)."""
        plan = self.plan
        body = {"model": plan.model, **spec.body, **plan.extra_body}
        stream_it = plan.stream and spec.api != "embeddings"
        if stream_it:
            body["stream"] = True
            body["stream_options"] = {"include_usage": True}
        target, prefix, http = plan.target_for(index)
        path = prefix + API_PATHS[spec.api]
        payload = _dumps(body)
        sent_at, start = clock_pair()
        due = sent_at if scheduled_at is None else scheduled_at
        wait = None if slot_at is None else max(0.0, slot_at - due)
        rid = str(index) if turn is None else f"{index}.{turn[0]}"
        self.last_turn = turn is not None and turn[1]
        rec = {"request_id": rid, "kind": spec.kind, "scheduled_at": due, "sent_at": sent_at,
               "dispatch_lag_s": None, "slot_wait_s": wait,
               "phase": "warmup" if (phase_at or due) < plan.t0 + plan.warmup_s else "measured",
               "session_id": None if turn is None else str(index), "turn": None if turn is None else turn[0],
               "ttfc_s": None, "target": target if len(plan.targets) > 1 else None,
               "first_token_at": None, "ttft_s": None, "itl_s": [], "status": "ok", "error_kind": None,
               "error": None, "prompt_tokens": None, "completion_tokens": None, "cached_tokens": None,
               "reasoning_tokens": None, "tokens_from": None}
        plan.inflight[rec["request_id"]] = rec  # in every in-flight list from now on (a worker's, a flush's)
        if plan.on_sent is not None:
            # the recorder (or the master) holds the request before the server does: a process killed outright
            # still leaves it a row. Waited for, not just yielded to: under load the pipe can be full.
            try:
                plan.on_sent(rec).wait()
            except GreenletExit:  # the run stopped before it went out: not sent, no record
                plan.inflight.pop(rec["request_id"], None)
                if plan.on_withdrawn is not None:
                    plan.on_withdrawn(rec)
                raise
            sent_at, start = clock_pair()  # the wait, if any, is the client's lag (an open loop's)
            rec["sent_at"] = sent_at
            if scheduled_at is None:  # a closed loop sends when it is ready: no schedule to lag behind
                due = rec["scheduled_at"] = sent_at
        rec["dispatch_lag_s"] = sent_at - due - (wait or 0.0)
        stream = Stream(start, plan.event_max, keep_text=turn is not None)
        # known while it streams, so a run's end can tell a request that is already an SLO miss (late first token)
        stream.on_first = lambda now: rec.__setitem__("first_token_at", sent_at + (now - start))
        exc: RequestFailed | None = None
        got_headers = False
        plan.sent += 1
        resp = None
        try:
            with gevent.Timeout(plan.timeout_s, _Deadline):
                resp = http.request("POST", path, body=payload, headers=plan.headers)
                got_headers = True
                stream.server_id = resp.get(SERVER_ID_HEADER)
                status = resp.status_code
                if status != 200:
                    text = resp.read()[:ERROR_TEXT_MAX].decode("utf-8", "replace")
                    raise RequestFailed(f"http_{status}", text or resp.status_message or "")
                with cancel.armed(plan.cancel, plan.seed, rid, stream):
                    if stream_it:
                        stream.read_sse(resp)
                    elif spec.api == "embeddings":
                        stream.read_embeddings(resp.read())
                    else:
                        stream.read_json(resp.read())
        except RequestFailed as e:
            exc = e
        except _Deadline:
            exc = RequestFailed("timeout", f"no complete response within {plan.timeout_s:g}s")
        except GreenletExit:  # the run was stopped with this request in flight: it still gets its record
            exc = RequestFailed("cancelled", "run stopped before the response ended")
            self._finish(rec, stream, exc, spec)
            raise
        except TimeoutError as e:
            exc = RequestFailed("timeout", f"read/connect timed out: {e}")
        except (HTTPConnectionClosed, ConnectionResetError, BrokenPipeError) as e:
            exc = RequestFailed("early_close", str(e) or type(e).__name__)
        except HTTPParseError as e:  # the server vanishing mid-body reads as "Incomplete response"
            kind = "early_close" if "incomplete" in str(e).lower() else "malformed_stream"
            exc = RequestFailed(kind, f"HTTP parse error: {e}")
        except OSError as e:
            exc = RequestFailed("connect" if not got_headers else "early_close", str(e) or type(e).__name__)
        except Exception as e:  # whatever else went wrong, the request still gets its one record
            exc = RequestFailed("client_error", f"{type(e).__name__}: {e}")
        finally:
            if resp is not None:
                resp.release()
        return self._finish(rec, stream, exc, spec)

    def _finish(self, rec: dict, stream: Stream, exc: RequestFailed | None, spec: workloads.RequestSpec) -> dict:
        if exc is None and stream.error is not None:
            exc = stream.error
        sent_at, due = rec["sent_at"], rec["scheduled_at"] + (rec["slot_wait_s"] or 0.0)
        finished_at = sent_at + (time.perf_counter() - stream.start)
        rec["finished_at"] = finished_at
        rec["e2e_s"] = finished_at - due
        if stream.first is not None:
            rec["first_token_at"] = sent_at + (stream.first - stream.start)
            rec["ttft_s"] = rec["first_token_at"] - due
        rec["itl_s"] = stream.gaps
        if stream.first_content is not None:  # the first token that is not reasoning (nor a tool call)
            rec["ttfc_s"] = sent_at + (stream.first_content - stream.start) - due
        if rec["session_id"] is not None:
            self.answer = "".join(stream.text)
            rec["session_last"] = self.last_turn or exc is not None  # counted, not stored
        notes = stream.token_counts(rec)
        n = rec["completion_tokens"]
        if stream.first is not None and n and n > 1 and stream.last is not None:
            rec["tpot_s"] = (stream.last - stream.first) / (n - 1)
        else:
            rec["tpot_s"] = None
        if isinstance(exc, cancel.Cancelled):  # on purpose (--cancel): its own status, not an error
            rec["status"] = "cancelled"
            notes.append(exc.message)
            exc = None  # nor a failure in Locust's own statistics
        elif exc is not None:
            rec["status"], rec["error_kind"] = "error", exc.kind
            rec["error"] = redact(exc.message, self.plan.secret)[:ERROR_TEXT_MAX]
        if notes:  # they quote what the server sent: the key it may have echoed is redacted like an error's text
            rec["note"] = redact("; ".join(notes), self.plan.secret)
        self.plan.recorded += 1
        self.plan.inflight.pop(rec["request_id"], None)
        self.environment.events.request.fire(
            request_type="POST", name=f"{spec.kind}:{spec.api}", response_time=rec["e2e_s"] * 1000.0,
            response_length=stream.nbytes, exception=exc,
            context={"capbench": rec, "server_request_id": stream.server_id})
        return rec


    def session(self, i: int, due: float | None, slot_at: float | None = None) -> None:
        """Closed-loop session i: turn N+1 is due at turn N's last token plus a think time, and carries turn N's
        answer; a failed turn ends the session. Every turn counts from its own due time; the session's start says
        whether it is warm-up."""
        plan = self.plan
        sess = plan.session(i)
        start = due
        while True:
            last = sess.turn == sess.turns - 1
            rec = self.send(sess.request(), i, due, slot_at, (sess.turn, last), start)
            slot_at = None
            if rec["status"] != "ok" or not sess.answered(self.answer, rec["completion_tokens"]):
                return
            due = time.time() + sess.think_s()
            wait_until(due)
            if plan.stopping:
                return


class ClosedLoopUser(OpenAIUser):
    """`users` profile: one request after another, with the profile's think time between them."""

    def wait_time(self) -> float:
        return float(self.plan.config.get("think_s", 0.0))

    @task
    def ask(self) -> None:
        plan = self.plan
        if time.time() >= plan.end_at or plan.stopping:
            gevent.sleep(0.2)  # the run's time is up: send nothing new, let the runner stop us
            return
        i = plan.next_index()
        if plan.sessions:
            self.session(i, None)
        else:
            self.send(plan.request(i), i, None)


class OpenLoopUser(OpenAIUser):
    """Open loop: take the next arrival slot of the shared schedule, wait for its time, send."""

    @task
    def ask(self) -> None:
        plan = self.plan
        slot = plan.claim()
        if slot is None:
            gevent.sleep(0.2)
            return
        i, due = slot
        spec = None if plan.sessions else plan.request(i)  # built before the wait, so the send is on time
        wait_until(due)
        if plan.stopping:
            return
        send = (lambda slot_at: self.session(i, due, slot_at)) if spec is None else \
            (lambda slot_at: self.send(spec, i, due, slot_at))
        if plan.slots is None:
            send(None)
            return
        at_once = plan.slots.take()  # a free slot (a session holds it for all its turns): lateness is the client's
        try:
            if not plan.stopping:
                send(due if at_once else time.time())
        finally:
            plan.slots.give()
