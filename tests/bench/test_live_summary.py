"""The run's summary table says, on the row under TTFT, how late the client was when it fell behind its schedule
(TTFT counts from the due time), and counts the requests the client cancelled on purpose apart from the errors."""

from rich.console import Console

from bench.live import summary_table
from bench.report.content import _late


def _summary(**kw) -> dict:
    s = {"run_id": "r1", "status": "completed", "measured": 100, "warmup": 0, "ok": 100, "errors": 0,
         "errors_by_kind": {}, "cancelled": 0, "achieved_rate_rps": 5.0, "throughput_rps": 5.0, "output_tps": 50.0,
         **{f"{m}_p{q}": 0.001 for m in ("ttft", "tpot", "itl", "e2e", "dispatch_lag") for q in (50, 90, 95, 99)},
         "ttft_lag_p50": 0.0004, "ttft_from_send_p50": 0.0006}
    return {**s, **kw}


def _text(s: dict) -> str:
    console = Console(record=True, width=160)
    console.print(summary_table(s))
    return console.export_text()


def test_a_late_client_is_said_beside_ttft():
    on_time = _text(_summary())
    assert "client was late" not in on_time and _late(_summary()) == ""
    late = _summary(dispatch_lag_p99=0.45, ttft_p50=0.4551, ttft_lag_p50=0.45, ttft_from_send_p50=0.0051)
    text = _text(late)
    lines = text.splitlines()
    row = next(i for i, x in enumerate(lines) if "of which the client was late" in x)
    assert "ttft p50" in lines[row - 1]  # the row under TTFT's
    assert "p50 450.0 ms: TTFT p50 from the send 5.1 ms" in lines[row]
    assert _late(late) == " (the client late: p50 450 ms)"


def test_cancelled_requests_have_a_row_of_their_own_and_are_not_errors():
    text = _text(_summary(measured=100, ok=80, errors=0, cancelled=20))
    assert "80 / 0" in text and "20 (--cancel; not errors" in text
    assert "cancelled by the client" not in _text(_summary())
