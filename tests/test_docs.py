"""The README and docs/ as a reader follows them: every relative link (and its #anchor) leads somewhere, and the
README stays a short front page. Their command lines are parsed in tests/engine_patches/test_command_lines.py."""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
PAGES = [README, *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def prose(text: str) -> str:
    """The text outside fenced code blocks (a `[x](y)` or `# ...` inside one is code, not a link or a heading)."""
    return "".join(part for i, part in enumerate(re.split(r"^```.*$", text, flags=re.M)) if i % 2 == 0)


def anchors(page: Path) -> set[str]:
    """GitHub's anchors for a page's headings: lower case, punctuation dropped, spaces as hyphens."""
    slugs = set()
    for heading in re.findall(r"^#{1,6} +(.+?) *#* *$", prose(page.read_text()), re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")
        n = sum(s == slug or re.fullmatch(re.escape(slug) + r"-\d+", s) is not None for s in slugs)
        slugs.add(f"{slug}-{n}" if n else slug)
    return slugs


def relative_links(page: Path) -> list[str]:
    return [t for t in LINK.findall(prose(page.read_text())) if not re.match(r"[a-z][a-z0-9+.-]*:", t)]


LINKS = [(page, target) for page in PAGES for target in relative_links(page)]


def test_the_docs_pages_exist_and_link_each_other():
    names = {p.name for p in PAGES}
    assert {"README.md", "planning.md", "campaigns.md", "load-tests.md", "results-store.md", "engine-patches.md",
            "dashboard-and-reports.md", "architecture.md"} <= names
    index = {t.split("#")[0] for t in relative_links(ROOT / "docs" / "README.md")}
    assert {p.name for p in PAGES if p.parent.name == "docs" and p.name != "README.md"} <= index
    readme = {t.split("#")[0] for t in relative_links(README)}
    assert {f"docs/{p.name}" for p in PAGES if p.parent.name == "docs"} <= readme


@pytest.mark.parametrize("page,target", LINKS, ids=[f"{p.relative_to(ROOT)}->{t}" for p, t in LINKS])
def test_relative_link_resolves(page, target):
    path, _, anchor = target.partition("#")
    dest = (page.parent / path).resolve() if path else page
    assert dest.exists(), f"{page.relative_to(ROOT)} links to {target}: no such file"
    if anchor:
        assert dest.suffix == ".md", f"{target}: an anchor into a file that is not Markdown"
        assert anchor in anchors(dest), f"{page.relative_to(ROOT)} links to {target}: no such heading"


def test_anchor_slugs_are_githubs():
    page = ROOT / "docs" / "planning.md"
    assert "the-performance-model-benchmodelstepperfmodelpy" in anchors(page)
    assert "capbench-validate-how-far-to-trust-the-model" in anchors(page)


def test_the_readme_stays_a_front_page():
    lines = len(README.read_text().splitlines())
    assert lines < 260, f"README.md has {lines} lines: move detail into docs/"


def test_the_readmes_plan_figures_are_the_commands():
    """The "Where it stands" row for Kimi K2 Thinking at 20 req/s quotes what `capbench plan` answers (from the
    shipped answers, a few seconds): the GPUs, the cost, its range and the disaggregated runner-up."""
    import json
    import subprocess
    import sys

    row = next(line for line in README.read_text().splitlines() if line.startswith("| Kimi K2 Thinking, chat at 20"))
    out = subprocess.run([sys.executable, "-c", "from bench.cli import main; main()", "plan", "--model",
                          "kimi-k2-thinking", "--workload", "chat", "--rate", "20", "--slo", "ttft=2s,tpot=50ms,p=90",
                          "--json"], capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-2000:]
    head = json.loads(out.stdout)["headline"]
    (lo, hi), (clo, chi) = head["gpus_range"], head["cost_range"]
    quoted = (f"{head['gpus']} GPUs, ${head['monthly_cost']:,.0f} a month, range {lo}-{hi} GPUs "
              f"(${clo:,.0f}-${chi:,.0f}")
    assert quoted in row, f"README.md quotes another plan than `capbench plan` gives: {quoted}"
    assert head["summary"].startswith("3 x B200 tp4 ep4, NVFP4 experts") and "3 x B200 tp4 ep4 with NVFP4" in row
    runner = re.search(r"(\d+P:\d+D) \((\d+) GPUs\), (\$[\d,]+)", head["runner_up"])
    assert runner and f"{runner[1]}, {runner[2]} GPUs, {runner[3]}" in row


def fp8_rows() -> list[str]:
    """docs/planning.md's FP8 KV table as bench/model/advice/fp8_kv.py gives it: tp8, 8k context, backends that
    give the same figures on one row."""
    from bench.model import catalog, fp8_kv
    from bench.model.fits.capacity import Deployment

    rows = []
    for m in ("kimi-k2-thinking", "glm-4.6"):
        for g in ("h200", "b200"):
            groups: dict[tuple, list[str]] = {}
            for e in fp8_kv.effects(Deployment(catalog.model(m), catalog.gpu(g), 8)):
                by = "kernel tables" if e.priced_by == "kernel tables" else "attention by the roofline (no table)"
                key = (f"{e.pool_ratio:.2f}x", f"{e.step_ratio - 1:+.0%}", f"{e.throughput_ratio:.2f}x", by)
                groups.setdefault(key, []).append(e.backend)
            rows += [f"| {m} | {g} | {' / '.join(v)} | {' | '.join(k)} |" for k, v in groups.items()]
    return rows


def test_the_fp8_kv_figures_in_the_docs_are_the_models():
    """The FP8 KV table of docs/planning.md and the README's Kimi-on-H200 row quote fp8_kv.effects (they went stale
    once: a refit moved them and nothing said so)."""
    planning = (ROOT / "docs" / "planning.md").read_text()
    rows = fp8_rows()
    missing = [r for r in rows if r not in planning]
    assert not missing, "docs/planning.md's FP8 KV table is not the model's: " + "; ".join(missing)
    fa3 = next(r for r in rows if r.startswith("| kimi-k2-thinking | h200 | fa3 |")).split(" | ")
    row = next(line for line in README.read_text().splitlines() if line.startswith("| FP8 KV for Kimi K2 on H200"))
    step = 1 + int(fa3[4].rstrip("%")) / 100
    assert f"takes {step:.1f}x BF16's and tok/s falls to {fa3[5]}" in row, row
    flashmla = next(r for r in rows if r.startswith("| kimi-k2-thinking | h200 | flashmla")).split(" | ")
    assert f"roofline, {flashmla[4].rstrip('%')} %" in row, row
