import os

import pytest

os.environ.setdefault("TRITON_INTERPRET", "1")


def _define_torchvision_ops() -> None:
    """PyPI's torchvision is a CUDA build; beside CPU torch it fails on import with
    "operator torchvision::nms does not exist". SGLang's config package imports it, so tests
    define the two op schemas it registers fakes for before anything imports torchvision."""
    try:
        import torch
    except ImportError:
        return
    lib = torch.library.Library("torchvision", "DEF")
    lib.define("nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
    lib.define("qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
    _define_torchvision_ops.lib = lib  # keep the library alive


_define_torchvision_ops()


@pytest.fixture
def tmp_db(tmp_path):
    return tmp_path / "capbench.duckdb"
