"""A Locust worker that runs loadgen's users for a master and sends each result record back to it.

    python -m loadgen.worker --master-host HOST [--master-port 5557] [--keep]   (what `capbench worker` runs)

The run's config comes from the master with every spawn message (Locust copies custom parsed options to its
workers); records travel back as the custom message RECORDS_MSG, batched every 0.2 s and when the users stop,
with the worker's requests in flight. Nothing here touches the store: the master's recorder writes.

A local worker (started by the master, `--parent-pid`) also writes its requests and records straight into a pipe
of its own to the master's recorder process (frames.py; the fd in CAPBENCH_RECORDER_FD): each request is
announced there before it is sent, and when the master is gone (or on SIGTERM/SIGINT) the worker stops its users,
writes their `cancelled` records and exits, so a master killed outright loses none of its rows. A worker on another
machine has only the master: a master killed outright loses that worker's rows of the last 0.2 s (its last batch)
and the requests it announced in that time (docs/load-tests.md).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time

import gevent
from gevent.event import Event
from locust.env import Environment

from loadgen.frames import PIPE_FD_ENV, PipeWriter, inflight, rows
from loadgen.users import CONFIG_OPTION, ClosedLoopUser, OpenLoopUser

RECORDS_MSG = "capbench_records"
MASTER_GONE_S = 4.0  # the master sends a heartbeat every second
FLUSH_S = 0.2
USER_CLASSES = [ClosedLoopUser, OpenLoopUser]


def locust_options(config: dict) -> argparse.Namespace:
    """Locust's parsed options with the run's config in them (as JSON: it rides along to workers)."""
    from locust import argument_parser

    parser = argument_parser.get_empty_argument_parser()
    argument_parser.setup_parser_arguments(parser)
    ns = parser.parse(args=[])
    ns.headless = False  # a shape's end calls stop(), not quit(): workers report their last records first
    setattr(ns, CONFIG_OPTION, json.dumps(config))
    return ns


def master_gone(environment: Environment, parent_pid: int | None) -> str | None:
    """Why the master is gone, or None: the process that started this worker died (a local worker), or no
    heartbeat came from the master for MASTER_GONE_S (a worker on another machine)."""
    if parent_pid is not None and os.getppid() != parent_pid:
        return "the master process that started this worker is gone"
    last = getattr(environment.runner, "last_heartbeat_timestamp", None)
    if last is not None and time.time() - last > MASTER_GONE_S:
        return f"no heartbeat from the master for {MASTER_GONE_S:g} s"
    return None


class Forwarder:
    """This worker's records and requests in flight, on to the master (and the recorder's pipe, if any)."""

    def __init__(self, environment: Environment, parent_pid: int | None = None, pipe: PipeWriter | None = None):
        self.env, self.parent_pid, self.pipe = environment, parent_pid, pipe
        self.batch: list[dict] = []  # records not yet sent to the master
        self.unpiped: list[dict] = []  # records not yet in the recorder's pipe
        self.pending: list[Event] = []
        self.left = self.signalled = False
        environment.capbench_on_sent = self.on_sent
        environment.events.request.add_listener(self.on_request)
        environment.events.test_stop.add_listener(lambda **_kw: self.send(not self.left))
        gevent.spawn(self.loop)

    def plan(self):
        return getattr(self.env, "capbench_plan", None)

    def on_request(self, context=None, **_kw) -> None:
        rec = (context or {}).get("capbench")
        if rec is not None:
            self.batch.append(rec)
            self.unpiped.append(rec)

    def send(self, to_master: bool = True) -> None:
        plan = self.plan()
        live = inflight(plan.inflight.values()) if plan is not None else []
        if self.pipe is not None and (self.unpiped or live):
            done, self.unpiped = self.unpiped, []
            self.pipe.write({"rows": rows(done), "inflight": live})
        out, self.batch = self.batch, []
        if to_master:
            self.env.runner.send_message(RECORDS_MSG, {"records": out, "sent": plan.sent if plan else 0,
                                                       "inflight": live, "stored": self.pipe is not None})

    def loop(self) -> None:
        while not self.left:
            gevent.sleep(FLUSH_S)
            why = master_gone(self.env, self.parent_pid)
            if why:
                self.leave(why)
                return
            self.send()

    def on_sent(self, rec: dict) -> Event:
        """The recorder (through the pipe) or the master hears of a request before the server does."""
        if self.pipe is not None:  # written before the request goes out: a write to a pipe is done when it returns
            self.pipe.write({"started": inflight([rec])})
            done = Event()
            done.set()
            return done
        if not self.pending:
            heard = Event()
            self.pending.append(heard)

            def announce() -> None:  # a greenlet: sending may wait
                self.pending.clear()
                try:
                    self.send()
                finally:
                    heard.set()

            gevent.spawn(announce)
        return self.pending[0]

    def stop_users(self, to_master: bool) -> None:
        """No new request from here on; those in flight end as `cancelled` records, written at once."""
        plan = self.plan()
        if plan is not None:
            plan.stopping = True
        self.env.capbench_stopping = True
        self.env.runner.user_greenlets.kill(block=True, timeout=5)
        self.send(to_master)

    def leave(self, why: str, tell_master: bool = False) -> None:
        """Stop sending, write the records of the requests cut off (the recorder's pipe takes them even with the
        master gone) and end the worker; tell_master: say so to the master first (it drops this worker)."""
        self.left = True
        plan = self.plan()
        print(f"capbench worker: {why}; stopping ({plan.sent if plan else 0} requests sent)", file=sys.stderr,
              flush=True)
        self.stop_users(to_master=tell_master)
        if tell_master:
            self.env.events.quitting.fire(environment=self.env, reverse=True)  # Locust's worker sends "quit"
        if self.pipe is not None:
            self.pipe.close()
        self.env.runner.greenlet.kill(block=False)

    def on_signal(self) -> None:
        """SIGTERM/SIGINT (often the whole process group's, the master's too): the users stop, their records
        reach the master (and the recorder's pipe), the worker ends (a --keep worker too)."""
        if not self.signalled:
            self.signalled = True
            gevent.spawn(self.leave, "signalled", tell_master=True)


def forward_records(environment: Environment, parent_pid: int | None = None) -> Forwarder:
    """On a worker: batch this process's records to the master every 0.2 s and when the users stop; leave when
    the master is gone (master_gone)."""
    fd = os.environ.get(PIPE_FD_ENV)
    return Forwarder(environment, parent_pid, PipeWriter(int(fd)) if fd and parent_pid is not None else None)


def run_worker(master_host: str, master_port: int = 5557, once: bool = True, connect_timeout_s: float = 300.0,
               parent_pid: int | None = None) -> bool:
    """Join a master's run until it quits; with once=False, then wait for the next master on that address (the
    stages of a sweep, successive runs). Each wait for a master lasts connect_timeout_s at most: returns False if
    no master came the first time, True once a run was served and no next master came."""
    served = False
    current: list[Forwarder] = []

    def on_signal() -> None:
        if current:  # in a run
            current[0].on_signal()
        else:  # between runs: nothing sent, nothing to report
            print("capbench worker: signalled between runs; exiting", file=sys.stderr, flush=True)
            os._exit(0)

    for sig in (signal.SIGTERM, signal.SIGINT):
        gevent.signal_handler(sig, on_signal)
    while True:
        current.clear()
        env = Environment(user_classes=USER_CLASSES, parsed_options=locust_options({}))
        try:
            with gevent.Timeout(connect_timeout_s, ConnectionError):
                env.create_worker_runner(master_host, master_port)
        except ConnectionError:
            if env.runner is not None:
                env.runner.greenlet.kill(block=False)
                env.runner.client.close()
            return served
        fwd = forward_records(env, parent_pid)
        current.append(fwd)
        env.runner.greenlet.join()
        current.clear()
        env.runner.client.close()
        served = True
        if once or fwd.signalled:
            return True
        gevent.sleep(1.0)  # the master of the next run binds the port again


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description="A capbench Locust worker.")
    ap.add_argument("--master-host", required=True)
    ap.add_argument("--master-port", type=int, default=5557)
    ap.add_argument("--keep", action="store_true", help="after a run, wait for the next one")
    ap.add_argument("--connect-timeout", type=float, default=300.0)
    ap.add_argument("--parent-pid", type=int, help="leave when this process (the master that started us) is gone")
    a = ap.parse_args()
    raise SystemExit(0 if run_worker(a.master_host, a.master_port, not a.keep, a.connect_timeout, a.parent_pid)
                     else 1)
