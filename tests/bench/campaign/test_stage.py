"""Every request a stage sends is judged: one the stage's end cut off (no first token, or no full answer) counts
as an SLO miss, in the share and in the percentiles, never dropped; errors are counted apart."""

from bench.campaign.stage import FAR, drain_s, judge, meets, stage_counts
from bench.model import Slo
from bench.store import BatchedWriter, Store

SLO = Slo(ttft_s=1.0, tpot_s=0.1, percentile=90)


def _stage(tmp_db, rows: list[tuple[str, str | None, float | None, float | None]]) -> tuple[Store, str]:
    """rows: (status, error_kind, ttft_s, tpot_s); ttft None: no first token."""
    store = Store(tmp_db)
    run_id = store.start_run(label="stage", target="http://127.0.0.1:9", profile="poisson", config={})
    t0 = store.run(run_id)["started_at"]
    n = len(rows)
    due = [t0 + i for i in range(n)]
    first = [None if r[2] is None else d + r[2] for d, r in zip(due, rows, strict=True)]
    done = [d + (r[2] or 0) + 10 * (r[3] or 0.05) for d, r in zip(due, rows, strict=True)]
    with BatchedWriter(store, run_id, flush_interval_s=60) as w:
        w.add_requests({"request_id": [f"r{i}" for i in range(n)], "phase": ["measured"] * n, "scheduled_at": due,
                        "sent_at": due, "first_token_at": first, "finished_at": done,
                        "ttft_s": [r[2] for r in rows], "tpot_s": [r[3] for r in rows],
                        "e2e_s": [f - d for f, d in zip(done, due, strict=True)],
                        "completion_tokens": [11] * n, "status": [r[0] for r in rows],
                        "error_kind": [r[1] for r in rows]})
    store.finish_run(run_id)
    return store, run_id


def test_requests_still_running_at_the_stage_end_count_as_misses(tmp_db):
    ok = [("ok", None, 0.2, 0.05)] * 16
    store, run_id = _stage(tmp_db, ok + [("ok", None, 3.0, 0.05),  # completed, outside the SLO
                                         ("error", "cancelled", None, None),  # cut off before a first token
                                         ("error", "cancelled", 0.3, None),  # cut off mid-answer
                                         ("error", "http_500", None, None)])  # an error, not a miss
    s = judge(store, run_id, SLO)
    assert (s["sent"], s["completed"], s["within_slo"], s["missed"], s["cut_off"], s["errored"]) == (20, 17, 16, 3,
                                                                                                      2, 1)
    assert s["slo_attainment"] == 16 / 19  # the cut-off requests stay in the share; the error is counted apart
    assert "20 sent, 17 completed, 3 missed the SLO (2 cut off), 1 errored" == stage_counts(s)
    assert s["tpot_p90"] >= FAR  # the cut-off requests are in the percentile, past every bound


def test_a_stage_cut_off_with_requests_running_misses_the_slo(tmp_db):
    """8 of 10 served within the SLO, 2 still running when the stage ended: p90 is one of the cut-off ones."""
    store, run_id = _stage(tmp_db, [("ok", None, 0.2, 0.05)] * 8 + [("error", "cancelled", None, None),
                                                                     ("error", "cancelled", 0.3, None)])
    s = judge(store, run_id, SLO)
    ok_, why = meets(s, SLO)
    assert not ok_ and "cut off" in why and s["missed"] == 2 and s["slo_attainment"] == 0.8, why


def test_survivors_alone_would_have_passed(tmp_db):
    """The same stage without its cut-off requests meets the SLO: so it is they that fail it."""
    store, run_id = _stage(tmp_db, [("ok", None, 0.2, 0.05)] * 17 + [("ok", None, 3.0, 0.05)])
    s = judge(store, run_id, SLO)
    assert meets(s, SLO) == (True, "") and s["missed"] == 1 and s["cut_off"] == 0


def test_a_stage_of_errors_misses_and_says_so(tmp_db):
    store, run_id = _stage(tmp_db, [("ok", None, 0.2, 0.05)] * 10 + [("error", "http_500", None, None)] * 2)
    ok_, why = meets(judge(store, run_id, SLO), SLO)
    assert not ok_ and "17% of requests failed" in why


def test_the_stage_waits_up_to_the_slo_bound_for_a_full_answer():
    assert drain_s(Slo(ttft_s=2.0, tpot_s=0.05), 600) == 2.0 + 30.0
    assert drain_s(Slo(ttft_s=2.0, e2e_s=9.0), 600) == 9.0
    assert drain_s(Slo(), 600) is None


def test_a_capped_clients_wait_for_a_slot_counts_in_the_slo(tmp_db):
    """Behind --max-concurrency the TTFT stored is bench_serving's (from the slot); the user also waited for the slot,
    and the SLO judges both, as the model's capped prediction does."""
    store, run_id = _stage(tmp_db, [("ok", None, 0.2, 0.05)] * 10)
    with store.connect() as con:
        con.execute("UPDATE requests SET slot_wait_s = CASE WHEN request_id IN ('r8', 'r9') THEN 2.0 ELSE 0.1 END "
                    "WHERE run_id = ?", [run_id])
    s = judge(store, run_id, SLO)
    assert s["within_slo"] == 8 and s["slo_attainment"] == 0.8
    assert s["ttft_p90"] == 2.2 and s["e2e_p90"] >= 2.0
    ok_, why = meets(s, SLO)
    assert not ok_ and why.startswith("TTFT p90 2.2 s"), why
