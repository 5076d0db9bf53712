"""The CLI's first screen and the tables after it, one pattern for every command that answers (plan, simulate,
validate, campaign): the answer first, in at most ~15 lines of at most SCREEN columns (fewer on a narrower
terminal), ending with where the rest is (`More: --details ... or --json`); then the tables, each within TABLES
columns. A name (a case, a cell, a GPU, a KV dtype) is never wrapped: its column is no_wrap and the tables are laid
out so that their widest row fits; figures with their intervals and prose wrap at spaces only."""

from __future__ import annotations

import textwrap
from collections.abc import Iterable

from rich import box
from rich.console import Console
from rich.table import Column, Table

SCREEN = 100  # the first screen's widest line
TABLES = 120  # the widest table after it


def width() -> int:
    """The terminal's columns (COLUMNS when stdout is not a terminal; rich's 80 without either)."""
    return Console().width


def wrapped(text: str, columns: int) -> list[str]:
    """One paragraph as lines of at most `columns`, the lines after the first indented, never inside a word."""
    return textwrap.wrap(text, columns, subsequent_indent="  ", break_long_words=False, break_on_hyphens=False)


def lines(paragraphs: Iterable[str], columns: int | None = None) -> list[str]:
    """Paragraphs (each may hold newlines: each line its own) as first-screen lines of min(terminal, SCREEN)."""
    columns = min(columns or width(), SCREEN)
    return [x for p in paragraphs for line in p.splitlines() for x in (wrapped(line, columns) or [""])]


def show(paragraphs: Iterable[str]) -> None:
    print("\n".join(lines(paragraphs)))


def more(what: str, elsewhere: str = "--json") -> str:
    """The first screen's last line: where the rest is."""
    return f"More: --details ({what}) or {elsewhere}."


def tables_console() -> Console:
    """Where the tables go: the terminal's width, at least TABLES (each table's own widest row keeps it within)."""
    return Console(width=max(width(), TABLES))


def table(*columns: Column | str, title: str | None = None) -> Table:
    """A table in the screen's style: a rule under the header, no frame, two columns between cells."""
    return Table(*columns, title=title, title_justify="left", box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False,
                 padding=(0, 1, 0, 0))


def name(header: str) -> Column:
    """A column of names: left, never wrapped."""
    return Column(header, no_wrap=True)


def figure(header: str) -> Column:
    """A column of figures: right, wrapped only at spaces (a figure above its interval)."""
    return Column(header, justify="right")


def prose(header: str, max_width: int | None = None) -> Column:
    """A column of words, wrapped at spaces within `max_width`."""
    return Column(header, max_width=max_width)
