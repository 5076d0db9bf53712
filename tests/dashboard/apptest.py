"""Helpers for AppTest: run a page script of the dashboard, read its metrics as numbers."""

from __future__ import annotations

from pathlib import Path

from streamlit.testing.v1 import AppTest

ROOT = Path(__file__).resolve().parents[2]


def page(name: str) -> AppTest:
    at = AppTest.from_file(str(ROOT / "dashboard" / "views" / f"{name}.py"), default_timeout=120)
    return at.run()


def metric(at: AppTest, label: str) -> float | str:
    """A metric's value as a number when it is one ('1,606,143' -> 1606143.0, '$22,134' -> 22134.0)."""
    for m in at.metric:
        if m.label == label or m.label.startswith(label):
            text = m.value.replace(",", "").replace("$", "").replace("%", "").replace("GB", "").strip()
            try:
                return float(text)
            except ValueError:
                return m.value
    raise AssertionError(f"no metric {label!r}; have {[m.label for m in at.metric]}")


def no_exception(at: AppTest) -> None:
    assert not at.exception, [e.value for e in at.exception]


def table_with(at: AppTest, column: str):
    """The first dataframe on the page that has `column` (AppTest does not expose a dataframe's key)."""
    for d in at.dataframe:
        if column in d.value.columns:
            return d.value
    raise AssertionError(f"no table with a {column!r} column")


def has_table_with(at: AppTest, column: str) -> bool:
    return any(column in d.value.columns for d in at.dataframe)
