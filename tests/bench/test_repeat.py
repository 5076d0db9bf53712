"""`capbench run --repeat N` and `--until-ci FIGURE:WIDTH` (the installed command, from a tmp folder) against the
twin: N runs in one repeat group, each figure's 90 % interval printed and containing each run's value; a steady
server stops the repeats early; bad options are one line and exit 2."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import duckdb
import pytest

from bench.store import Store, repeats

CAPBENCH = str(Path(sys.executable).parent / "capbench")
TWIN = "twin:glm-4.6@h200x8,time_scale=20"
LOAD = ["--profile", "constant", "--rate", "4", "--duration", "3", "--input-len", "64", "--output-len", "16",
        "--no-live", "--model", "m"]


def _capbench(tmp_path: Path, *args: str, timeout: float = 600, load: list[str] = LOAD) -> subprocess.CompletedProcess:
    return subprocess.run([CAPBENCH, "run", "--target", TWIN, *load, "--db", str(tmp_path / "r.duckdb"), *args],
                          cwd=tmp_path, capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "COLUMNS": "200"})


def _group(db: Path) -> list[tuple[str, str, int]]:
    with duckdb.connect(str(db), read_only=True) as con:
        return con.execute("SELECT run_id, config->>'$.repeat_group', (config->>'$.repeat')::INT FROM runs "
                           "ORDER BY started_at").fetchall()


def test_repeat_3_makes_three_runs_and_an_interval_that_holds_each(tmp_path):
    out = _capbench(tmp_path, "--repeat", "3", "--label", "steady")
    assert out.returncode == 0, out.stderr[-3000:]
    runs = _group(tmp_path / "r.duckdb")
    assert len(runs) == 3 and len({g for _, g, _ in runs}) == 1 and [i for *_, i in runs] == [0, 1, 2]
    with Store(tmp_path / "r.duckdb", read_only=True).connect() as con:
        ivs = repeats.intervals(con, [r for r, _, _ in runs])
        labels = [x[0] for x in con.execute("SELECT label FROM runs ORDER BY started_at").fetchall()]
    assert labels == ["steady #1", "steady #2", "steady #3"]
    for figure in ("throughput_rps", "output_tps", "ttft_p50", "e2e_p99"):
        iv = ivs[figure]
        assert iv["n"] == 3 and iv["low"] <= iv["mean"] <= iv["high"]
        assert all(iv["low"] <= v <= iv["high"] for v in iv["values"]), (figure, iv)
    assert "repeat group" in out.stdout and "90 % interval" in out.stdout and "output_tps" in out.stdout
    assert f"{ivs['output_tps']['mean']:.4g}" in out.stdout


def test_until_ci_stops_early_on_a_steady_server(tmp_path):
    out = _capbench(tmp_path, "--repeat", "6", "--until-ci", "tok_s:10%")
    assert out.returncode == 0, out.stderr[-3000:]
    runs = _group(tmp_path / "r.duckdb")
    assert len(runs) == repeats.MIN_RUNS < 6, out.stderr  # the twin at a constant rate: tight from the first three
    assert "stopping after 3 runs: output_tps" in out.stderr


@pytest.mark.parametrize("args, said", [(["--repeat", "0"], "--repeat must be from 1"),
                                        (["--until-ci", "speed:5%"], "--until-ci takes FIGURE:WIDTH"),
                                        (["--until-ci", "tok_s:-5%"], "the width is a positive number"),
                                        (["--repeat", "2", "--until-ci", "tok_s:5%"], "at least 3"),
                                        (["--repeat", "2", "--profile", "sweep"], "not repeated")])
def test_bad_repeat_options_are_one_line_and_exit_2(tmp_path, args, said):
    load = ["--no-live", "--model", "m"] if "sweep" in args else LOAD
    out = _capbench(tmp_path, *args, timeout=120, load=load)
    assert out.returncode == 2 and said in out.stderr and len(out.stderr.strip().splitlines()) == 1, out.stderr
    assert not (tmp_path / "r.duckdb").exists()


def test_interval_is_students_t():
    iv = repeats.interval([10.0, 12.0, 11.0, None])
    # mean 11, sd 1, t(0.95, 2) = 2.919986 -> half 2.919986 / sqrt(3)
    assert iv["mean"] == pytest.approx(11.0) and iv["half"] == pytest.approx(2.919986 / 3 ** 0.5, rel=1e-5)
    assert repeats.interval([5.0]) is None
    assert repeats.within(iv, 0.16, True) and not repeats.within(iv, 0.15, True) and repeats.within(iv, 1.7, False)
