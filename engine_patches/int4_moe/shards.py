"""A safetensors checkpoint directory, checked before any work: every shard's header against its file size, and
the index against the shards. A truncated or corrupt download is refused in seconds, with the shard's name,
instead of failing hours into a conversion.

safetensors layout: 8 bytes little-endian header length N, N bytes of JSON {name: {dtype, shape, data_offsets}},
then the data; every tensor's [begin, end) lies in the data, its length is numel x dtype size, and the data ends
at the end of the file.
"""

from __future__ import annotations

import json
import math
import struct
from dataclasses import dataclass
from pathlib import Path

INDEX = "model.safetensors.index.json"
DTYPE_BYTES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1, "BOOL": 1,
               "F8_E4M3": 1, "F8_E5M2": 1, "U16": 2, "U32": 4, "U64": 8}
MAX_HEADER = 100 * 2**20


@dataclass(frozen=True)
class TensorInfo:
    dtype: str
    shape: tuple[int, ...]


@dataclass(frozen=True)
class Shard:
    name: str
    size: int  # bytes on disk
    tensors: dict[str, TensorInfo]


def read_header(path: Path) -> Shard:
    """The shard's tensors; ValueError naming the shard if the header or the file's length is wrong."""
    size = path.stat().st_size
    with path.open("rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise ValueError(f"{path.name}: truncated ({size} bytes, no safetensors header)")
        (n,) = struct.unpack("<Q", head)
        if n > MAX_HEADER or 8 + n > size:
            raise ValueError(f"{path.name}: truncated or not safetensors (header of {n} bytes in a {size}-byte file)")
        try:
            header = json.loads(f.read(n))
        except ValueError as e:
            raise ValueError(f"{path.name}: unreadable safetensors header ({e})") from None
    header.pop("__metadata__", None)
    tensors, data_end = {}, 0
    for name, t in header.items():
        try:
            dtype, shape, (begin, end) = t["dtype"], tuple(int(d) for d in t["shape"]), t["data_offsets"]
        except (KeyError, TypeError, ValueError):
            raise ValueError(f"{path.name}: malformed header entry for {name}") from None
        if dtype not in DTYPE_BYTES:
            raise ValueError(f"{path.name}: {name} has unknown dtype {dtype}")
        if end - begin != math.prod(shape) * DTYPE_BYTES[dtype] or begin < 0:
            raise ValueError(f"{path.name}: {name} ({dtype} {list(shape)}) has {end - begin} bytes of data")
        tensors[name] = TensorInfo(dtype, shape)
        data_end = max(data_end, end)
    if 8 + n + data_end != size:
        raise ValueError(f"{path.name}: truncated: the header describes {8 + n + data_end} bytes, the file has {size}")
    return Shard(path.name, size, tensors)


class Checkpoint:
    """Tensor names -> shards of a checked safetensors directory."""

    def __init__(self, root: Path):
        self.root = root
        self.index_file = root / INDEX
        files = sorted(p.name for p in root.glob("*.safetensors"))
        if self.index_file.is_file():
            try:
                self.weight_map: dict[str, str] = dict(json.loads(self.index_file.read_text())["weight_map"])
            except (ValueError, KeyError, TypeError):
                raise ValueError(f"{self.index_file}: not a safetensors index (no weight_map)") from None
            missing = sorted(set(self.weight_map.values()) - set(files))
            if missing:
                raise ValueError(f"{INDEX} names shards that are not in {root}: {', '.join(missing[:3])}")
            files = sorted(set(self.weight_map.values()))
        if not files:
            raise ValueError(f"no safetensors weights in {root}")
        self.shards = {name: read_header(root / name) for name in files}
        found = {t: s.name for s in self.shards.values() for t in s.tensors}
        if self.index_file.is_file():
            for tensor, shard in self.weight_map.items():
                if found.get(tensor) != shard:
                    raise ValueError(f"{INDEX} puts {tensor} in {shard}, but that shard does not hold it")
        else:
            self.weight_map = found
        self.has_index = self.index_file.is_file()

    @property
    def total_bytes(self) -> int:
        return sum(s.size for s in self.shards.values())

    def info(self, name: str) -> TensorInfo:
        return self.shards[self.weight_map[name]].tensors[name]
