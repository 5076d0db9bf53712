"""The store across real processes: a writer killed with SIGKILL, and a reader reading while a writer writes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

from bench.store import BatchedWriter, Store, queries

KILLED_WRITER = textwrap.dedent("""
    import sys, time
    from bench.store import BatchedWriter, Store
    store = Store(sys.argv[1])
    earlier = store.start_run(label="earlier")
    with BatchedWriter(store, earlier) as w:
        for i in range(50):
            w.add_request({"request_id": f"e{i}", "sent_at": 1.0, "first_token_at": 1.5, "finished_at": 2.0})
    store.finish_run(earlier)
    run = store.start_run(label="killed")
    w = BatchedWriter(store, run, flush_interval_s=0.01)  # flushing all the time, so the kill often lands mid-write
    for i in range(100):
        w.add_request({"request_id": f"k{i}", "itl_s": [0.01] * 20})
    w.flush()
    print(run, flush=True)
    i, told = 100, False
    while True:
        w.add_request({"request_id": f"k{i}", "itl_s": [0.01] * 20})
        w.add_gpu_sample({"t": time.time(), "gpu": 0, "power_w": 400.0})
        i += 1
        if i % 50 == 0:
            time.sleep(0.005)
        if not told and w.flushes >= 3:
            print("more", flush=True)
            told = True
""")

LIVE_WRITER = textwrap.dedent("""
    import os, sys, time
    from bench.store import BatchedWriter, Store
    store = Store(sys.argv[1])
    run = store.start_run(label="live")
    print(run, flush=True)
    w = BatchedWriter(store, run, flush_interval_s=0.1)
    n = 0
    while not os.path.exists(sys.argv[2]):  # until the reader has seen enough
        now = time.time()
        for _ in range(20):
            w.add_request({"request_id": f"r{n}", "scheduled_at": now, "sent_at": now, "first_token_at": now + 0.1,
                           "finished_at": now + 0.5, "completion_tokens": 10, "itl_s": [0.04] * 9})
            n += 1
        time.sleep(0.01)
    w.close()
    store.finish_run(run)
    print(n, w.busy_flushes, flush=True)
""")



def _spawn(script: str, db) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", script, str(db)], stdout=subprocess.PIPE, text=True,
                            cwd=os.getcwd())


def test_sigkilled_writer_loses_only_its_last_second(tmp_db):
    proc = _spawn(KILLED_WRITER, tmp_db)
    try:
        run_id = proc.stdout.readline().strip()
        assert run_id, "writer did not start"
        assert proc.stdout.readline().strip() == "more"  # later flushes happened too
        time.sleep(0.1)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
    finally:
        proc.kill()
    # its recorder, slow to start on a loaded machine, opens the file after the kill: it spares its own run (it
    # still has rows to write, then marks it aborted itself)
    assert Store(tmp_db, recording=run_id).aborted_on_open == []
    store = Store(tmp_db)  # reopening recovers the WAL and marks the dead writer's run
    assert store.aborted_on_open == [run_id]
    runs = store.runs().set_index("label")
    assert runs.loc["earlier", "status"] == "completed" and runs.loc["earlier", "requests"] == 50
    assert runs.loc["killed", "status"] == "aborted"
    assert runs.loc["killed", "finished_at"] is not None
    with store.connect() as con:
        ids = {r[0] for r in con.execute("SELECT request_id FROM requests WHERE run_id = ?", [run_id]).fetchall()}
        assert {f"k{i}" for i in range(100)} <= ids  # everything flushed before the kill is there
        assert len(ids) > 100  # and the flushes after it too
        s = queries.summary(con, run_id)
    assert s["measured"] == len(ids) and s["itl_p50"] is not None
    assert Store(tmp_db).aborted_on_open == []  # marked once


def test_a_reader_reads_while_a_writer_writes(tmp_db, tmp_path):
    stop = tmp_path / "stop"
    proc = subprocess.Popen([sys.executable, "-c", LIVE_WRITER, str(tmp_db), str(stop)], stdout=subprocess.PIPE,
                            text=True)
    try:
        run_id = proc.stdout.readline().strip()
        assert run_id, "writer did not start"
        seen = []
        deadline = time.monotonic() + 60
        while len(set(seen)) < 4 and time.monotonic() < deadline:  # the run seen growing, not just its end
            reader = Store(tmp_db, read_only=True, lock_timeout_s=5)
            with reader.connect() as con:
                seen.append(queries.summary(con, run_id)["requests"])
            time.sleep(0.05)
        stop.touch()
        out = proc.stdout.read().split()
        assert proc.wait(timeout=30) == 0
    finally:
        proc.kill()
    written = int(out[0])
    assert len(set(seen)) >= 4, seen
    assert seen == sorted(seen)  # never a half-written or rolled-back view
    final = Store(tmp_db, read_only=True).runs()
    assert final.requests[0] == written and final.status[0] == "completed"


def test_a_writer_locked_out_keeps_its_rows_until_it_gets_in(tmp_db):
    import pytest

    from bench.store import StoreBusy

    store = Store(tmp_db)
    run_id = store.start_run(label="locked out")
    w = BatchedWriter(store, run_id, flush_interval_s=3600)  # flushes only when asked
    for i in range(5):
        w.add_request({"request_id": str(i)})
    w.add_requests({"request_id": [str(i) for i in range(5, 10)]})
    holder = subprocess.Popen([sys.executable, "-c", "import duckdb, sys, time\n"
                               "con = duckdb.connect(sys.argv[1], read_only=True)\n"
                               "print('holding', flush=True)\n"
                               "sys.stdin.readline()\n", str(tmp_db)],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "holding"
        with pytest.raises(StoreBusy):
            w.flush(lock_timeout_s=0.2)
        assert w.pending() == 10
        w.add_request({"request_id": "10"})
        holder.stdin.write("\n")
        holder.stdin.flush()
        holder.wait(timeout=10)
        w.close()
    finally:
        holder.kill()
    assert store.runs().requests[0] == 11


def test_a_writer_never_closed_still_writes_its_rows_when_the_interpreter_exits(tmp_db):
    script = textwrap.dedent("""
        import sys
        from bench.store import BatchedWriter, Store
        store = Store(sys.argv[1])
        w = BatchedWriter(store, store.start_run(label="forgot close"), flush_interval_s=3600)
        for i in range(25):
            w.add_request({"request_id": str(i)})
    """)
    subprocess.run([sys.executable, "-c", script, str(tmp_db)], check=True, timeout=60)
    assert Store(tmp_db).runs().requests[0] == 25
