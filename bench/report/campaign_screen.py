"""What `capbench campaign` prints when a campaign ends (bench/report/screen.py's pattern): first the answer, each
deployment against its baseline measured beside the model's gain, then each cell's highest rate within the SLO;
`--details` adds the rest of campaign_sections' columns, the long ones (where the SLO broke, how an interval was
found, what a gain's interval says, quality) as lines under their table. The HTML report and the dashboard show the
same sections whole."""

from __future__ import annotations

from rich.console import Group
from rich.text import Text

from bench.report import screen
from bench.report.campaign import QUALITY_HEAD, Matrix, campaign_sections, gain_said, headline

# columns of words, said as "name: column: text" under their table rather than squeezed into a cell
PROSE = ("repeats (interval)", "saturation / error", "what it says", QUALITY_HEAD, "at saturation and in quality")
NAMES = ("cell", "deployment", "baseline", "load", "what changed")
FIRST = ("cell", "status", "measured req/s", "predicted req/s (80 %)", "measured $/1M out")  # without --details
MORE = "each cell's predicted $/1M, repeats, bracket, stages and where the SLO broke; what each gain's interval says"


def _x(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}x"


def gain_line(g: dict) -> str:
    """One gain as the campaign, the demo and its benchmark print it: measured with its 90 % interval, what that says
    and how the interval was found, the model's gain."""
    if g.get("busy"):  # bench/report/campaign.py: a twin that fell further behind than the gain's interval is wide
        return f"{g['deployment']} vs {g['baseline']}, {g['load']}: {gain_said(g)}; predicted {_x(g['predicted_gain'])}"
    lo, hi = g.get("gain_interval") or [None, None]
    interval = f" [{lo:.2f}-{hi:.2f}]" if lo is not None and hi is not None else ""
    return (f"{g['deployment']} vs {g['baseline']}, {g['load']}: measured {_x(g['measured_gain'])}{interval} at "
            f"saturation, {gain_said(g)}; predicted {_x(g['predicted_gain'])}"
            + (f" ({g['error']:+.0%})" if g["error"] is not None else ""))


def campaign_answer(m: Matrix) -> list[str]:
    """The first screen: the campaign, its cells' outcome, each gain in one paragraph, why each failed cell did."""
    done = sum(c["status"] == "completed" for c in m.cells)
    failed = sum(c["status"] == "failed" for c in m.cells)
    out = [f"Campaign {m.name} ({m.campaign_id}, {m.status}): {len(m.cells)} cells, {done} completed"
           + (f", {failed} failed" if failed else "") + "."]
    for g in m.gains:
        out.append(headline(g) if "quality" in g else f"{g['what']}, {gain_line(g)}")
    for c in m.cells:
        if c["status"] == "failed":
            out.append(f"{c['cell']} failed: {next(iter((c.get('error') or 'no error recorded').splitlines()))}")
    return out


def _header(h: str) -> str:
    """A long header on two lines, split at the space nearest its middle."""
    if len(h) <= 12 or " " not in h:
        return h
    cut = min((i for i, ch in enumerate(h) if ch == " "), key=lambda i: abs(i - len(h) / 2))
    return f"{h[:cut]}\n{h[cut + 1:]}"


def _table(title: str, head: list[str], rows: list[list[str]], shown: list[int]) -> list:
    columns = [screen.name(_header(head[i])) if head[i] in NAMES else
               screen.prose(_header(head[i]), 24) if head[i] in ("status", "what differs") else
               screen.figure(_header(head[i])) for i in shown]
    t = screen.table(*columns)
    for r in rows:
        t.add_row(*(r[i] for i in shown))
    return [Text("\n".join(screen.wrapped(title, screen.SCREEN))), t]  # not wrapped to the table's width


def campaign_tables(m: Matrix, details: bool = False) -> Group:
    """The sections as tables within screen.TABLES columns: without `details`, the cells' measured and predicted
    rates; with it, every column (the words under their table)."""
    parts = []
    for n, (title, head, rows) in enumerate(campaign_sections(m)):
        first = n == 0
        if not details and not first:
            break
        table = [i for i, h in enumerate(head) if h not in PROSE]
        if first:
            table = [i for i in table if head[i] in FIRST]
        if table != [0]:
            parts += _table(title, head, rows, table)
        if not details:
            break
        if first:  # the rest of each cell, beside its name
            rest = [i for i, h in enumerate(head) if i == 0 or (h not in PROSE and h not in FIRST)]
            parts += _table("Each cell, the rest:", head, rows, rest)
        prose = [i for i, h in enumerate(head) if h in PROSE]
        for r in rows:
            said = "; ".join(f"{head[i]}: {r[i]}" for i in prose if r[i] and r[i] != "-")
            if said:
                parts.append(Text(f"{r[0]}" + (f" ({r[2]})" if head[:3] == ["deployment", "baseline", "load"]
                                               else "") + f": {said}"))
    return Group(*parts)
