import shutil

import pytest

from tests.rundb import fill

PAGES = "dashboard/views"


@pytest.fixture(scope="session")
def filled_db(tmp_path_factory):
    """A DB with the four runs of tests/rundb.py, written once; tests that change it take a copy."""
    path = tmp_path_factory.mktemp("dash") / "capbench.duckdb"
    ids = fill(path)
    return path, ids


@pytest.fixture
def db(filled_db, monkeypatch):
    path, ids = filled_db
    monkeypatch.setenv("CAPBENCH_DB", str(path))
    return path, ids


@pytest.fixture
def db_copy(filled_db, tmp_path, monkeypatch):
    path, ids = filled_db
    copy = tmp_path / "copy.duckdb"
    shutil.copy(path, copy)
    monkeypatch.setenv("CAPBENCH_DB", str(copy))
    return copy, ids
