"""Every file a user hands in is checked before anything runs (bench/files.py): the bad files of issue 39, given to
the installed CLI from a scratch folder, are one line naming the file, the key and the value, and exit 2; never a
traceback, a hang on a FIFO or /dev/zero, or minutes expanding an alias bomb."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

CAPBENCH = str(Path(sys.executable).parent / "capbench")
ALIAS_BOMB = "a: &a [x,x,x,x,x,x,x,x,x]\n" + "".join(
    f"{n}: &{n} [{', '.join([f'*{p}'] * 9)}]\n" for p, n in zip("abcdef", "bcdefg", strict=True)) + \
    "type: synthetic\ninput: 64\noutput: 64\n"
DEEP = "type: synthetic\ninput: 64\noutput: 64\nx: " + "[" * 3000 + "]" * 3000 + "\n"
# file -> (text, what the one line names: the key and the value)
WORKLOADS = {
    "median-nan": ("input: {dist: lognormal, median: .nan, sigma: 0.5}\noutput: 64\n", "input.median", "nan"),
    "median-inf": ("input: {dist: lognormal, median: .inf, sigma: 0.5}\noutput: 64\n", "input.median", "inf"),
    "median-negative": ("input: {dist: lognormal, median: -5, sigma: 0.5}\noutput: 64\n", "input.median", "-5"),
    "output-median-nan": ("input: 64\noutput: {dist: lognormal, median: .nan, sigma: 0.5}\n", "output.median", "nan"),
    "output-median-negative": ("input: 64\noutput: {dist: lognormal, median: -1, sigma: 1}\n", "output.median", "-1"),
    "sigma-nan": ("input: {dist: lognormal, median: 100, sigma: .nan}\noutput: 64\n", "input.sigma", "nan"),
    "sigma-1e6": ("input: {dist: lognormal, median: 100, sigma: 1000000}\noutput: 64\n", "input.sigma", "1000000"),
    "fixed-nan": ("input: {dist: fixed, value: .nan}\noutput: 64\n", "input.value", "nan"),
    "mean-inf": ("input: {dist: normal, mean: .inf, std: 1}\noutput: 64\n", "input.mean", "inf"),
    "uniform-upside-down": ("input: {dist: uniform, min: 900, max: 10}\noutput: 64\n", "input", "900"),
    "groups-0": ("type: shared_prefix\ngroups: 0\nsystem_tokens: 100\ninput: 64\noutput: 64\n", "groups", "0"),
    "sessions-0": ("type: multi_turn\nconcurrent_sessions: 0\ninput: 64\noutput: 64\n", "concurrent_sessions", "0"),
    "turns-0": ("type: agentic_coding\nturns: 0\ninput: 64\noutput: 64\n", "turns", "0"),
    "tool-output-negative": ("type: agentic_coding\ntool_output: -3\ninput: 64\noutput: 64\n", "tool_output", "-3"),
    "unknown-key": ("input: 64\noutput: 64\ngropus: 4\n", "gropus", "unknown key"),
    "nested-3000": (DEEP, "nested deeper", ""),
    "alias-bomb": (ALIAS_BOMB, "aliases", ""),
}


def _capbench(cwd: Path, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([CAPBENCH, *args], cwd=cwd, capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "COLUMNS": "200"})


def _one_line(r: subprocess.CompletedProcess, *names: str) -> str:
    assert r.returncode == 2, (r.returncode, r.stdout[-500:], r.stderr[-2000:])
    assert "Traceback" not in r.stderr + r.stdout
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    for name in names:
        assert name in lines[0], (name, lines[0])
    return lines[0]


@pytest.mark.parametrize("case", sorted(WORKLOADS))
def test_simulate_refuses_a_bad_workload_file_in_one_line(tmp_path, case):
    text, key, value = WORKLOADS[case]
    (tmp_path / f"{case}.yaml").write_text(text)
    r = _capbench(tmp_path, "simulate", "--model", "glm-4.6", "--gpu", "h200", "--tp", "8", "--workload",
                  f"{case}.yaml", "--rate", "1", "--num-requests", "20")
    _one_line(r, f"{case}.yaml", key, value)


@pytest.mark.parametrize("case", ["median-nan", "sigma-1e6", "groups-0", "sessions-0", "nested-3000", "alias-bomb"])
def test_plan_refuses_a_bad_workload_file_in_one_line(tmp_path, case):
    text, key, value = WORKLOADS[case]
    (tmp_path / f"{case}.yaml").write_text(text)
    r = _capbench(tmp_path, "plan", "--model", "glm-4.6", "--workload", f"{case}.yaml", "--rate", "1", "--gpus",
                  "h200", "--workers", "1")
    _one_line(r, f"{case}.yaml", key, value)


@pytest.mark.parametrize("kind", ["fifo", "dev-zero", "directory"])
def test_a_workload_that_is_not_a_regular_file_is_refused_without_reading_it(tmp_path, kind):
    path = tmp_path / "w.yaml"
    if kind == "fifo":
        os.mkfifo(path)  # no writer: a blocking open would wait forever
    elif kind == "dev-zero":
        path.symlink_to("/dev/zero")  # read to the end, it never ends
    else:
        path.mkdir()
    r = _capbench(tmp_path, "simulate", "--model", "glm-4.6", "--gpu", "h200", "--tp", "8", "--workload", "w.yaml",
                  "--rate", "1", timeout=60)
    line = _one_line(r, "w.yaml")
    assert "no such" in line or "not a regular file" in line or "not a file" in line


def test_the_shipped_workloads_pass_their_schema():
    from loadgen import workloads

    for name in workloads.names():
        assert workloads.load(name).name


CALIBRATIONS = {
    "hbm-0": ("hbm_eff: 0\n", "hbm_eff", "0"),  # divided by
    "hbm-nan": ("hbm_eff: .nan\n", "hbm_eff", "nan"),
    "kernel-inf": ("kernel_us: .inf\n", "kernel_us", "inf"),
    "gpu-fraction-1e308": ("gpus: {h200: {bf16_eff: 1e308}}\n", "gpus.h200.bf16_eff", "1e308"),
    "value-nan": ("default: {overlap: {value: .nan, source: x}}\n", "default.overlap", "nan"),
    "nested-3000": ("x: " + "[" * 3000 + "]" * 3000 + "\n", "nested deeper", ""),
}


@pytest.mark.parametrize("case", sorted(CALIBRATIONS))
def test_simulate_refuses_a_bad_calibration_file_in_one_line(tmp_path, case):
    text, key, value = CALIBRATIONS[case]
    (tmp_path / f"{case}.yaml").write_text(text)
    r = _capbench(tmp_path, "simulate", "--model", "glm-4.6", "--gpu", "h200", "--tp", "8", "--input-len", "64",
                  "--output-len", "64", "--rate", "1", "--num-requests", "20", "--calibration", f"{case}.yaml")
    _one_line(r, f"{case}.yaml", key, value)


def test_a_deep_json_calibration_is_one_line(tmp_path):
    (tmp_path / "deep.json").write_text('{"x": ' + "[" * 3000 + "]" * 3000 + "}")
    (tmp_path / "nan.json").write_text('{"hbm_eff": NaN}')
    for name, said in (("deep.json", "nested deeper"), ("nan.json", "NaN is not a finite number")):
        r = _capbench(tmp_path, "simulate", "--model", "glm-4.6", "--gpu", "h200", "--tp", "8", "--input-len", "64",
                      "--output-len", "64", "--rate", "1", "--num-requests", "20", "--calibration", name)
        _one_line(r, name, said)


def _run_with_times(db: Path, ttft: float, tpot: float) -> str:
    """A twin run of 20 measured requests whose stored TTFT and TPOT are `ttft` and `tpot`."""
    from bench.store import BatchedWriter, Store

    store = Store(db)
    run_id = store.start_run(label="bad times", target="http://127.0.0.1:1", profile="poisson",
                             config={"twin": "twin:glm-4.6@h200x8"})
    t0 = store.run(run_id)["started_at"]
    n = 20
    with BatchedWriter(store, run_id, flush_interval_s=60) as w:
        w.add_requests({"request_id": [f"r{i}" for i in range(n)], "phase": ["measured"] * n,
                        "scheduled_at": [t0 + i * 0.1 for i in range(n)], "sent_at": [t0 + i * 0.1 for i in range(n)],
                        "ttft_s": [ttft] * n, "tpot_s": [tpot] * n, "prompt_tokens": [500] * n,
                        "completion_tokens": [64] * n, "status": ["ok"] * n})
    store.finish_run(run_id)
    return run_id


@pytest.mark.parametrize("ttft, tpot", [(-0.5, 0.02), (float("nan"), 0.02), (0.0, 0.0), (1e308, 1e308),
                                        (0.2, float("-inf"))])
def test_calibrate_refuses_a_run_with_nothing_to_fit(tmp_path, ttft, tpot):
    run_id = _run_with_times(tmp_path / "c.duckdb", ttft, tpot)
    r = _capbench(tmp_path, "calibrate", "--runs", run_id, "--db", "c.duckdb", "--out", "fitted.json")
    _one_line(r, run_id, "nothing to fit")
    assert not (tmp_path / "fitted.json").exists()  # no "fitted" file with the factors unchanged


@pytest.mark.parametrize("kind", ["fifo", "dev-zero", "alias-bomb", "nested-3000"])
@pytest.mark.parametrize("role", ["campaign", "templates"])
def test_campaign_and_templates_files_are_read_with_the_same_limits(tmp_path, kind, role):
    bad = tmp_path / "bad.yaml"
    if kind == "fifo":
        os.mkfifo(bad)
    elif kind == "dev-zero":
        bad.symlink_to("/dev/zero")
    else:
        bad.write_text(ALIAS_BOMB if kind == "alias-bomb" else DEEP)
    args = ["campaign", "bad.yaml", "--check"] if role == "campaign" else \
        ["campaign", "demo", "--check", "--templates", "bad.yaml"]
    line = _one_line(_capbench(tmp_path, *args, timeout=60), "bad.yaml")
    said = {"fifo": "not a regular file (a FIFO)", "dev-zero": "not a regular file (a character device)",
            "alias-bomb": "aliases (*name) are not accepted", "nested-3000": "nested deeper than 24 levels"}[kind]
    assert said in line, line
