"""`capbench export`: every table's rows of one run, as Parquet or CSV files; and how any output file is written
(a temporary file renamed onto it: a full disk or a kill leaves the old file or none, never half a file)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from bench.errors import BadInput
from bench.store.db import Store, require_run
from bench.store.schema import RUN_TABLES


def export_run(store: Store, run_id: str, fmt: str, out_dir: str | Path) -> list[Path]:
    """Write every table's rows of one run to OUT_DIR/<table>.<fmt>; list columns become text in CSV."""
    import pyarrow.csv as pacsv
    import pyarrow.parquet as pq

    if fmt not in ("parquet", "csv"):
        raise BadInput(f"export format must be parquet or csv, not {fmt!r}")
    out = Path(out_dir)
    written = []
    with store.connect() as con:
        require_run(con, run_id)
        tables = {}
        for name in RUN_TABLES:
            select = "SELECT * REPLACE (CAST(itl_s AS VARCHAR) AS itl_s)" if (
                name == "requests" and fmt == "csv") else "SELECT *"
            tables[name] = con.sql(f"{select} FROM {name} WHERE run_id = ?", params=[run_id]).to_arrow_table()
    out.mkdir(parents=True, exist_ok=True)
    for name, table in tables.items():
        path = out / f"{name}.{fmt}"
        with replacing(path) as tmp:
            if fmt == "parquet":
                pq.write_table(table, tmp)
            else:
                pacsv.write_csv(table, tmp)
        written.append(path)
    return written


@contextmanager
def replacing(path: str | Path) -> Iterator[Path]:
    """A temporary path beside `path`, renamed onto it if the block ends without error, removed if not. A write
    that fails (disk full) is one line (BadInput), and the file is whole or untouched."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.part")
    try:
        yield tmp
        tmp.replace(path)
    except OSError as e:
        raise BadInput(f"cannot write {path}: {e.strerror or e}") from None
    except Exception as e:  # pyarrow wraps the OS error in its own
        if "No space left" in str(e) or "Errno" in str(e):
            raise BadInput(f"cannot write {path}: {str(e).splitlines()[0][:200]}") from None
        raise
    finally:
        tmp.unlink(missing_ok=True)
