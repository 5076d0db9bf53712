"""`capbench export`: every table's rows of one run, as Parquet or CSV files."""

from __future__ import annotations

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
        if fmt == "parquet":
            pq.write_table(table, path)
        else:
            pacsv.write_csv(table, path)
        written.append(path)
    return written
