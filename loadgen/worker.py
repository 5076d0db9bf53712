"""A Locust worker that runs loadgen's users for a master and sends each result record back to it.

    python -m loadgen.worker --master-host HOST [--master-port 5557] [--keep]   (what `capbench worker` runs)

The run's config comes from the master with every spawn message (Locust copies custom parsed options to its
workers); records travel back as the custom message RECORDS_MSG, batched every 0.2 s and when the users stop,
with the worker's requests in flight (so that a master killed outright still leaves them a row).
Nothing here touches the store: the master writes.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import gevent
from gevent.event import Event
from locust.env import Environment

from loadgen.users import CONFIG_OPTION, ClosedLoopUser, OpenLoopUser

RECORDS_MSG = "capbench_records"
MASTER_GONE_S = 4.0  # the master sends a heartbeat every second
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


def leave(environment: Environment, why: str) -> None:
    """Stop sending at once (nobody would store the rows) and end the worker."""
    plan = getattr(environment, "capbench_plan", None)
    if plan is not None:
        plan.stopping = True
    print(f"capbench worker: {why}; stopping ({plan.sent if plan else 0} requests sent)", file=sys.stderr, flush=True)
    environment.runner.user_greenlets.kill(block=False)
    environment.runner.greenlet.kill(block=False)


def forward_records(environment: Environment, parent_pid: int | None = None) -> None:
    """On a worker: batch this process's records to the master every 0.2 s and when the users stop; leave when
    the master is gone (master_gone)."""
    batch: list[dict] = []

    def on_request(context=None, **_kw) -> None:
        rec = (context or {}).get("capbench")
        if rec is not None:
            batch.append(rec)

    def send(final: bool = False) -> None:
        plan = getattr(environment, "capbench_plan", None)
        inflight = list(plan.inflight.values()) if plan is not None else []
        if batch or inflight or final:
            out, batch[:] = list(batch), []
            environment.runner.send_message(RECORDS_MSG, {"records": out, "sent": plan.sent if plan else 0,
                                                          "inflight": inflight})

    def loop() -> None:
        while True:
            gevent.sleep(0.2)
            why = master_gone(environment, parent_pid)
            if why:
                leave(environment, why)
                return
            send()

    def on_sent(_rec: dict) -> Event:  # the master hears of a request before the server does, not 0.2 s later
        if not pending:
            heard = Event()
            pending.append(heard)

            def announce() -> None:  # a greenlet: sending may wait
                pending.clear()
                try:
                    send()
                finally:
                    heard.set()

            gevent.spawn(announce)
        return pending[0]

    pending: list[Event] = []
    environment.capbench_on_sent = on_sent
    environment.events.request.add_listener(on_request)
    environment.events.test_stop.add_listener(lambda **_kw: send(final=True))
    gevent.spawn(loop)


def run_worker(master_host: str, master_port: int = 5557, once: bool = True, connect_timeout_s: float = 300.0,
               parent_pid: int | None = None) -> bool:
    """Join a master's run until it quits; with once=False, then wait for the next master on that address (the
    stages of a sweep, successive runs). Each wait for a master lasts connect_timeout_s at most: returns False if
    no master came the first time, True once a run was served and no next master came."""
    served = False
    while True:
        env = Environment(user_classes=USER_CLASSES, parsed_options=locust_options({}))
        try:
            with gevent.Timeout(connect_timeout_s, ConnectionError):
                env.create_worker_runner(master_host, master_port)
        except ConnectionError:
            if env.runner is not None:
                env.runner.greenlet.kill(block=False)
                env.runner.client.close()
            return served
        forward_records(env, parent_pid)
        env.runner.greenlet.join()
        env.runner.client.close()
        served = True
        if once:
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
