"""The live panel of a run against a twin k times faster than the GPUs it models shows the modelled GPUs' time
(rates / k, latencies x k) and says so, like every page and report: never the twin's own time."""

import time
from types import SimpleNamespace

import numpy as np
from rich.console import Console

from bench.live import Live


def _panel(config: dict) -> str:
    now = time.time()
    profile = SimpleNamespace(name="poisson", open_loop=True, type="poisson",
                              rate=lambda t: np.full(len(t), 20.0))
    live = Live(False, profile, {"t0": now - 5, "warmup_s": 0.0, "duration_s": 60.0, **config},
                SimpleNamespace(records=200, recent=[]), None, lambda: 200)
    live.ttft = [0.1] * 10
    live.sent = [(now - 2, 0), (now, 200)]
    console = Console(record=True, width=120)
    console.print(live.table(now))
    return console.export_text()


def test_a_twin_panel_is_in_the_modelled_gpus_time():
    text = _panel({"twin": "twin:kimi-k2-thinking@h200x8,kv=fp8_e4m3,time_scale=10"})
    assert "twin x10, figures in the time of 8x H200" in text
    assert "10.0 req/s sent vs 2.0 req/s" in text  # 100 and 20 req/s on the twin's clock
    assert "1000.0 / 1000.0 ms" in text  # 100 ms on the twin's clock
    assert "elapsed (wall clock)" in text


def test_a_gpu_panel_is_as_measured():
    text = _panel({"model": "kimi-k2-thinking"})
    assert "100.0 req/s sent vs 20.0 req/s" in text and "100.0 / 100.0 ms" in text and "twin" not in text


def test_the_summary_after_a_twin_run_is_in_the_modelled_time(tmp_path, capsys):
    from bench.live import print_summary
    from bench.store import BatchedWriter, Store, queries
    from tests.rundb import _requests

    store = Store(tmp_path / "t.duckdb")
    run_id = store.start_run(label="t", target="twin:x", profile="poisson",
                             config={"twin": "twin:glm-4.6@h200x8,time_scale=10"})
    with BatchedWriter(store, run_id, flush_interval_s=60) as w:
        _requests(w, np.random.default_rng(1), store.run(run_id)["started_at"], 4.0, 0.003, 0.03)
    store.finish_run(run_id)
    with store.connect() as con:
        raw = queries.summary(con, run_id, None)
    print_summary(raw, store=store)
    out = capsys.readouterr().out
    assert "twin x10, figures in the time of the modelled GPUs" in out
    assert f"{raw['ttft_p50'] * 1e4:.1f} ms" in out and f"{raw['achieved_rate_rps'] / 10:.2f} req/s" in out
