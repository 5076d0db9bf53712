"""The stored out-of-sample errors by SGLang version (python -m bench.benchmarks.kernel_validate --by-version): every
case counted once, and the confound docs/planning.md rests on (one version shared by two organisations) read off
the data, not written in."""

import statistics

from bench.benchmarks import kernel_validate
from bench.model import corpus, fit


def test_every_out_of_sample_case_is_counted_once_by_version_organisation_and_gpu():
    table = kernel_validate.by_version()
    rows = [r.split(" | ") for r in table.splitlines() if r.startswith("| 0") or r.startswith("| unknown")]
    stored = fit.stored_validation()["out_of_sample"]["cases"]
    assert sum(int(r[3]) for r in rows) == sum(1 for c in stored if c["errors"])
    version = {c.key: c.sglang_version for c in corpus.load()}
    sa = [1 + c["errors"]["output_tok_s"] for c in stored
          if c["org"] == "SemiAnalysis" and c["gpu"] == "b200" and "output_tok_s" in c["errors"]]
    row = next(r for r in rows if r[1] == "SemiAnalysis" and r[2] == "b200")
    assert float(row[4]) == round(statistics.median(sa), 2)
    shared = {v for v in version.values() if len({c.source.org for c in corpus.load() if c.sglang_version == v
                                                    and any(s["case"] == c.key and s["errors"] for s in stored)}) > 1}
    assert table.splitlines()[-1].startswith(f"Versions published by more than one organisation: "
                                            f"{', '.join(sorted(shared)) or 'none'} ")


def test_by_version_runs_from_the_command_line(capsys):
    assert kernel_validate.main(["--by-version"]) == 0
    out = capsys.readouterr().out
    assert "| SGLang version | organisation | GPU | cases |" in out


def test_the_bias_by_publisher_is_each_organisations_median_of_its_own_cases():
    stored = fit.stored_validation()["out_of_sample"]["cases"]
    rows = fit.out_of_sample_bias(("org",))
    assert sum(r["cases"] for r in rows) == sum(1 for c in stored if c["errors"])
    assert [r["cases"] for r in rows] == sorted((r["cases"] for r in rows), reverse=True)  # the largest first
    for r in rows:
        own = [1 + c["errors"]["tpot_ms"] for c in stored if c["org"] == r["org"] and "tpot_ms" in c["errors"]]
        assert r["ratio"].get("tpot_ms") == (statistics.median(own) if own else None)


def test_a_validation_file_without_cases_gives_no_bias_not_a_traceback(tmp_path, monkeypatch):
    for text in ('{"in_sample": {}}', '{"out_of_sample": {"cases": [{"case": "x"}, 3]}}', "not json"):
        (tmp_path / "validation.json").write_text(text)
        monkeypatch.setattr(fit, "VALIDATION", tmp_path / "validation.json")
        assert fit.out_of_sample_bias() == []
