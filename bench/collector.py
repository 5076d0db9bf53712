"""What a run's requests become on their way to the store: records from this process's users or from workers'
messages, handed on to the recorder process (bench/store/recorder.py) in frames every half second, and each request
announced as it goes out, so that a load generator killed outright still leaves every request it sent a row."""

from __future__ import annotations

import gevent
from gevent.event import Event

from bench.store import Recorder
from loadgen.frames import inflight as inflight_fields
from loadgen.frames import rows as store_rows


class Collector:
    """Result records from this process's users or from workers' messages, on to the recorder process."""

    def __init__(self, recorder: Recorder, inflight=None):
        self.recorder = recorder
        self.inflight = inflight  # () -> this process's requests in flight, sent along in case it is killed
        self.pending: list[dict] = []
        self.records = 0
        self.sessions_done = 0  # closed-loop sessions whose last record came (its last turn, or the one that failed)
        self.sent_by_worker: dict[str, int] = {}
        self.inflight_by_worker: dict[str, list[dict]] = {}
        self.recent: list[dict] = []  # for the live display
        self.starting: list[dict] = []  # requests going out, announced at the loop's next turn
        self.announced = Event()

    def on_request(self, context=None, **_kw) -> None:
        rec = (context or {}).get("capbench")
        if rec is not None:
            self.add([rec])

    def on_message(self, environment, msg, **_kw) -> None:
        self.sent_by_worker[msg.node_id] = msg.data["sent"]
        self.inflight_by_worker[msg.node_id] = msg.data.get("inflight", [])
        if msg.data.get("stored"):  # a local worker wrote them into the recorder's pipe itself: counted, not sent
            self.records += len(msg.data["records"])
            self.sessions_done += sum(1 for r in msg.data["records"] if r.get("session_last"))
            self.recent.extend(msg.data["records"])
            return
        self.add(msg.data["records"])
        self.flush()  # on to the recorder at once: a master killed now loses only the worker's last 0.2 s

    def started(self, rec: dict) -> Event:
        """A request is going out: announced to the recorder at the event loop's next turn, in one frame with the
        others due in that turn. The user waits for the returned event (set once the frame is in the recorder's
        pipe) before writing the request (users.py): the recorder hears of every request before the server does,
        and a process killed outright leaves each a row (`cancelled` at worst)."""
        self.starting.append(rec)
        if len(self.starting) == 1:
            self.announced = Event()
            gevent.spawn(self.announce, self.announced)  # a greenlet, not a loop callback: the write may wait
        return self.announced

    def withdrawn(self, rec: dict) -> None:
        """A request announced (or about to be) that was never sent: the run stopped while it waited."""
        if rec in self.starting:
            self.starting.remove(rec)
        else:
            self.recorder.withdrawn([rec["request_id"]])

    def announce(self, done: Event | None = None) -> None:
        recs, self.starting = self.starting, []
        try:
            if recs:
                self.recorder.started(inflight_fields(recs))
        finally:
            if done is not None:
                done.set()

    def add(self, recs: list[dict]) -> None:
        self.pending.extend(recs)
        self.recent.extend(recs)
        self.records += len(recs)
        self.sessions_done += sum(1 for r in recs if r.get("session_last"))

    def flush(self) -> None:
        rows, self.pending = store_rows(self.pending), []
        inflight = inflight_fields(self.inflight()) if self.inflight else None
        if rows or inflight is not None:
            self.recorder.send(rows, inflight)
