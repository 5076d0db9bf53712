"""The CLI's checks of numbers, URLs and paths (bench/checks.py, bench/cli/checks.py) one by one; the commands
themselves are fuzzed in test_cli_fuzz.py."""

import pytest

from bench.checks import check_target
from bench.cli.checks import check
from bench.errors import BadInput


@pytest.mark.parametrize("url", ["http://127.0.0.1:99999", "http://127.0.0.1:-1", "http://127.0.0.1:port",
                                 "http://[::1", "http://[fe80::zz]/", "http://:80", "ftp://127.0.0.1", "127.0.0.1:80",
                                 "http://127.0.0.1:0"])
def test_unusable_targets(url):
    with pytest.raises(BadInput):
        check_target(url)


@pytest.mark.parametrize("url", ["http://127.0.0.1:30000/", "https://h.example/v1", "http://[::1]:8000"])
def test_usable_targets(url):
    assert check_target(url) == url.rstrip("/")


def test_paths_are_resolved_once_against_the_current_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "cal.json").write_text("{}")
    (tmp_path / "wl.yaml").write_text("name: x\n")
    (tmp_path / "exists").write_text("")
    assert check("run", "db", "data/capbench.duckdb") == str(tmp_path / "data" / "capbench.duckdb")
    assert check("run", "workload", "wl.yaml") == str(tmp_path / "wl.yaml")
    assert check("run", "workload", "chat") == "chat"  # a built-in name stays a name
    assert check("run", "target", "twin:glm-4.6@h200x8,calibration=cal.json,kv=fp8_e4m3") == \
        f"twin:glm-4.6@h200x8,calibration={tmp_path / 'cal.json'},kv=fp8_e4m3"
    assert check("report", "out", "r/report.html") == str(tmp_path / "r" / "report.html")
    with pytest.raises(BadInput, match="is a directory"):
        check("report", "out", ".")
    with pytest.raises(BadInput, match="is a file, not a directory"):
        check("export", "out", "exists")
    with pytest.raises(BadInput, match="is a file, not a directory"):
        check("report", "out", "exists/report.html")
    with pytest.raises(BadInput, match="is a directory"):
        check("runs", "db", ".")


@pytest.mark.parametrize("command,key,value", [
    ("run", "rate", float("nan")), ("run", "rate", float("inf")), ("run", "rate", 0.0), ("run", "seed", -1),
    ("run", "max_inflight", 0), ("twin", "drift", 1.5), ("report", "price", -1.0), ("report", "tp", 0),
    ("plan", "workers", 0), ("capacity", "context", 2**40), ("calibrate_kv_scales", "margin", 0.0),
    ("validate", "rounds", 10**9), ("run", "nonexistent_option", 2**40),
])
def test_numbers_out_of_range(command, key, value):
    with pytest.raises(BadInput):
        check(command, key, value)


def test_numbers_in_range_pass_unchanged():
    assert check("simulate", "rate", float("inf")) == float("inf")  # all at once: simulate only
    assert check("twin", "port", 0) == 0 and check("run", "workers", 0) == 0 and check("run", "seed", 2**32 - 1)
