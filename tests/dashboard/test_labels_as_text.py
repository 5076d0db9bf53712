"""Run labels are the user's text: rendered by a Markdown renderer they stay text (no image that makes the browser
fetch a URL, no link, no HTML), in the dashboard's subheaders/captions and in `report --format md` tables."""

import pytest
from markdown_it import MarkdownIt

from bench.report.render import _md_table
from dashboard.common import md_text

LABELS = ["![pixel](http://198.51.100.7/track.png)", "[click](javascript:alert(1))", "<img src=x onerror=alert(1)>",
          "<script>alert(1)</script>", "**loud** _quiet_ `code`", "a | b", ":red[alarm] :material/home:",
          "kimi fp8-kv (demo) #1"]


@pytest.mark.parametrize("label", LABELS)
def test_a_label_renders_as_its_own_text(label):
    md = MarkdownIt("commonmark").enable("table")
    for html in (md.render(md_text(label)), md.render(_md_table(["run", "n"], [[label, "3"]]))):
        assert "<img" not in html and "<a " not in html and "<script" not in html and "<strong" not in html
        assert "<code" not in html and "<em" not in html
    # the words are all there, as text (the table has exactly its two cells per row)
    table = md.render(_md_table(["run", "n"], [[label, "3"]]))
    assert table.count("<td>") == 2
    plain = md.render(md_text(label))
    for word in ("pixel", "click", "alarm", "loud", "kimi"):
        if word in label:
            assert word in plain
