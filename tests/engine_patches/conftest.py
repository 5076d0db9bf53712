import os

import pytest


@pytest.fixture(scope="session", autouse=True)
def _checkpoint_cache(tmp_path_factory) -> None:
    """Where int4_checkpoints.cached_checkpoint and sglang_loads keep what they build (about 170 MB a run): pytest's
    temporary folder of this run, the one above each xdist worker's so that the workers share it; pytest keeps the
    last three runs' and deletes the rest."""
    base = tmp_path_factory.getbasetemp()
    root = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base
    os.environ["CAPBENCH_TEST_CHECKPOINTS"] = str(root / "capbench-checkpoints")
