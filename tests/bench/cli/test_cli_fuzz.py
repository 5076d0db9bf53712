"""Every command's numbers, fuzzed: whatever is typed (NaN, infinities, negatives, huge, not a number), the answer is
exit 0 or 2 and never a traceback. Plus the bad invocations the issue found, each one line and exit 2.

Runs bench.cli.main() in this process (hundreds of invocations; a process each would take minutes). Its `run`,
`worker` and `demo` patch the process with gevent, so this file is in the Locust test process (conftest).
Each command gets a fast way to fail once its numbers pass (an unknown model, an output path that is a
directory), so no example does real work."""

import contextlib
import io
import sys

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bench.cli import main

DIR = "/"  # a directory: refused as --db or as an output file, after the numbers are checked
BASES = {  # command -> (argv that fails fast once its numbers pass, its numeric options)
    "capacity": (["--model", "nope", "--gpu", "h200", "--tp", "8"], ["--tp", "--dp", "--context", "--mem-fraction",
                                                                    "--page-size"]),
    "simulate": (["--model", "nope", "--gpu", "h200", "--tp", "8"], ["--rate", "--num-requests", "--min-seconds",
                                                                    "--seed", "--dp", "--context"]),
    "plan": (["--model", "nope"], ["--rate", "--tp", "--price", "--context", "--workers", "--input-len",
                                   "--output-len"]),
    "validate": (["--case", "zzzz-none"], ["--rounds"]),
    "run": (["--target", "http://127.0.0.1:9", "--profile", "nope", "--model", "m", "--db", DIR],
            ["--rate", "--users", "--duration", "--warmup", "--workers", "--expect-workers", "--master-port",
             "--seed", "--timeout", "--max-inflight"]),
    "worker": (["--master", "no-such-host.invalid"], ["--master-port", "--connect-timeout"]),
    "twin": (["--model", "nope"], ["--tp", "--dp", "--port", "--time-scale", "--seed", "--drift",
                                   "--max-total-tokens", "--context"]),
    "demo": (["--db", DIR], ["--duration"]),
    "report": (["--out", DIR], ["--tp", "--context", "--input-len", "--output-len", "--target-rate", "--price"]),
    "dashboard": (["--db", DIR], ["--port"]),
    "drift": (["--target", "http://127.0.0.1:9"], ["--concurrency", "--max-mean-kl", "--min-token-agreement",
                                                   "--min-exact-match"]),
    "eval": (["--target", "http://127.0.0.1:9", "--suite", "nope", "--db", DIR],
             ["--limit", "--seed", "--concurrency", "--timeout", "--max-drop"]),
    "calibrate-kv-scales": (["--target", "x", "--amax", "/nonexistent", "--out", DIR],
                            ["--margin", "--tp-size", "--num-layers", "--max-tokens"]),
    "quantize-int4": (["--in", "/nonexistent", "--out", "/etc/hostname"], ["--group-size", "--tp", "--ep",
                                                                          "--workers"]),
    "sglang-launch": (["--dry-run", "--kv-checksum", "bogus"], ["--kv-scrub-pages-per-s"]),
}
OPTIONS = [(cmd, opt) for cmd, (_, opts) in BASES.items() for opt in opts]
VALUES = st.one_of(
    st.sampled_from(["nan", "NaN", "inf", "-inf", "1e308", "-1e308", "1e9", "-1", "0", "-0", "1", "2", "0.5", "abc",
                     "", "0x10", "1_000", "99999", "65536", "4294967296", "9" * 40, "1e-320"]),
    st.integers(-2**70, 2**70).map(str),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.text(max_size=8),
)


def invoke(*argv: str) -> tuple[int, str]:
    """capbench ARGV in this process: (exit code, stderr)."""
    old, err = sys.argv, io.StringIO()
    sys.argv = ["capbench", *argv]
    code = 0
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            main()
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    finally:
        sys.argv = old
    return code, err.getvalue()


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(OPTIONS), VALUES)
def test_any_number_is_exit_0_or_2_never_a_traceback(option, value):
    cmd, opt = option
    code, err = invoke(cmd, *BASES[cmd][0], f"{opt}={value}")  # =: a value that starts with '-' stays a value
    assert code in (0, 2), (cmd, opt, value, code, err)
    assert "Traceback" not in err


# path options, each with the rest of its command set to fail fast once the paths pass (P: the fuzzed path)
PATH_CASES = [
    ["runs", "--db", "P"],
    ["export", "--run", "x", "--db", "/nonexistent/x.duckdb", "--out", "P"],
    ["export", "--run", "x", "--db", "P", "--out", "/tmp/capbench-fuzz-export"],
    ["report", "--model", "nope", "--out", "P"],
    ["report", "--model", "nope", "--out", "/tmp/r.html", "--db", "P"],
    ["run", "--target", "http://127.0.0.1:9", "--model", "m", "--workload", "P", "--input-len", "5"],
    ["run", "--target", "http://127.0.0.1:9", "--model", "m", "--profile", "P", "--input-len", "5"],
    ["run", "--target", "http://127.0.0.1:9", "--model", "m", "--db", "P", "--input-len", "5"],
    ["simulate", "--model", "nope", "--gpu", "h200", "--tp", "8", "--calibration", "P"],
    ["simulate", "--model", "nope", "--gpu", "h200", "--tp", "8", "--workload", "P"],
    ["calibrate", "--runs", ",", "--db", "P"],
    ["calibrate", "--runs", ",", "--out", "P"],
    ["calibrate-kv-scales", "--target", "x", "--amax", "/nonexistent", "--out", "P"],
]
PATHS = st.one_of(
    st.sampled_from(["/", ".", "..", "~", "", "/etc/hostname", "/etc/hostname/x", "/nonexistent/deep/x", "data",
                     "data/capbench.duckdb", "a" * 5000, "a/" * 3000, "-", "--", "x\ny", " ", "twin:", "\u2603.yaml"]),
    st.text(max_size=30),
)


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(PATH_CASES), PATHS)
def test_any_path_is_exit_0_or_2_never_a_traceback(case, path):
    argv = [f"{a}={path}" if b == "P" else a for a, b in zip(case, [*case[1:], ""], strict=True) if a != "P"]
    code, err = invoke(*argv)
    assert code in (0, 2), (argv, code, err)
    assert "Traceback" not in err


@pytest.mark.parametrize("argv,message", [
    (["simulate", "--model", "kimi-k2-thinking", "--gpu", "h200", "--tp", "8", "--rate", "nan"], "--rate"),
    (["simulate", "--model", "kimi-k2-thinking", "--gpu", "h200", "--tp", "8", "--rate", "1e308"], "--rate"),
    (["run", "--target", "http://127.0.0.1:9", "--model", "m", "--rate", "1e9"], "--rate must be <="),
    (["run", "--target", "http://127.0.0.1:9", "--model", "m", "--seed", "-1"], "--seed must be >= 0"),
    (["run", "--target", "http://127.0.0.1:9", "--model", "m", "--max-inflight", "-1"], "--max-inflight"),
    (["run", "--target", "http://127.0.0.1:9", "--model", "m", "--timeout", "0"], "--timeout must be > 0"),
    (["run", "--target", "http://127.0.0.1:9", "--model", "m", "--warmup", "-1"], "--warmup must be >= 0"),
    (["run", "--target", "http://127.0.0.1:99999", "--model", "m"], "Port out of range"),
    (["run", "--target", "http://[::1", "--model", "m"], "not a usable URL"),
    (["run", "--target", "http://[fe80::zz]:80", "--model", "m"], "not a usable URL"),
    (["run", "--target", "http://127.0.0.1:9", "--model", "m", "--profile", "trace", "--param", "speedup=0"],
     "speedup must be a number > 0"),
    (["run", "--target", "http://127.0.0.1:9", "--model", "m", "--param", "rate=.nan"], "finite number"),
    (["run", "--target", "http://127.0.0.1:9", "--model", "m", "--rate", "100000", "--duration", "100000"],
     "a schedule is at most"),
    (["twin", "--time-scale", "nan"], "--time-scale must be a number"),
    (["twin", "--drift", "2"], "--drift must be <= 1"),
    (["twin", "--max-total-tokens", "0"], "--max-total-tokens must be >= 1"),
    (["report", "--out", "/tmp/r.html", "--price", "-1"], "--price must be > 0"),
    (["report", "--out", "/tmp/r.html", "--tp", "0"], "--tp must be >= 1"),
    (["report", "--out", "/tmp/r.html", "--target-rate", "nan"], "--target-rate must be a number"),
    (["report", "--out", "/"], "is a directory"),
    (["export", "--run", "x", "--out", "/etc/hostname"], "is a file, not a directory"),
    (["drift", "--target", "http://127.0.0.1:9", "--target", "http://127.0.0.1:11", "--concurrency", "0"],
     "--concurrency must be >= 1"),
    (["worker", "--master", "127.0.0.1", "--master-port", "99999"], "--master-port must be <= 65535"),
    (["worker", "--master", "no-such-host.invalid"], "does not resolve"),
    (["worker", "--master", "127.0.0.1", "--master-port", "9", "--connect-timeout", "1"], "no capbench run master"),
])
def test_the_issues_bad_inputs_are_one_line_and_exit_2(argv, message):
    code, err = invoke(*argv)
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1, err


def test_a_truncated_or_foreign_db_file_is_one_line(tmp_path):
    good = tmp_path / "good.duckdb"
    from bench.store import Store

    Store(good).start_run(label="x")
    data = good.read_bytes()
    for name, content in (("truncated", data[: len(data) // 2]), ("tiny", data[:100]), ("foreign", b"\x00junk" * 999)):
        path = tmp_path / f"{name}.duckdb"
        path.write_bytes(content)
        for argv in (["runs", "--db", str(path)], ["export", "--run", "x", "--out", str(tmp_path / "o"), "--db",
                                                   str(path)]):
            code, err = invoke(*argv)
            assert code == 2 and err.startswith("error: ") and len(err.strip().splitlines()) == 1, (name, err)
            if argv[0] == "runs":  # reads every table: the damage shows
                assert "cannot open" in err, (name, err)
