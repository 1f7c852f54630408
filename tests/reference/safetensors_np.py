"""A minimal safetensors reader on numpy: header JSON + memory-mapped data, nothing shared with the
engine and no dependency on the `safetensors` package."""

import json
import os
import struct

import numpy as np

_DTYPES = {
    "F64": np.dtype("<f8"),
    "F32": np.dtype("<f4"),
    "F16": np.dtype("<f2"),
    "BF16": np.dtype("<u2"),  # widened to float32 by `to_float`
    "I64": np.dtype("<i8"),
    "I32": np.dtype("<i4"),
    "I16": np.dtype("<i2"),
    "I8": np.dtype("i1"),
    "U8": np.dtype("u1"),
    "BOOL": np.dtype("?"),
}


class SafetensorsFile:
    """One .safetensors file: `names()`, `dtype(name)`, `shape(name)`, `raw(name)`."""

    def __init__(self, path):
        self.path = path
        size = os.path.getsize(path)
        with open(path, "rb") as f:
            (header_len,) = struct.unpack("<Q", f.read(8))
            if 8 + header_len > size:
                raise ValueError(
                    f"{path}: header length {header_len} runs past the end ({size} bytes)"
                )
            header = json.loads(f.read(header_len))
        header.pop("__metadata__", None)
        self._entries = header
        self._data_start = 8 + header_len
        self._map = np.memmap(path, dtype=np.uint8, mode="r") if size > 0 else None

    def names(self):
        return list(self._entries)

    def dtype(self, name):
        return self._entries[name]["dtype"]

    def shape(self, name):
        return list(self._entries[name]["shape"])

    def raw(self, name):
        """The tensor as stored (BF16 as uint16 bit patterns)."""
        entry = self._entries[name]
        dt = _DTYPES[entry["dtype"]]
        begin, end = entry["data_offsets"]
        count = int(np.prod(entry["shape"], dtype=np.int64))
        if end - begin != count * dt.itemsize:
            raise ValueError(
                f"{self.path}: tensor {name}: {end - begin} bytes "
                f"for {entry['shape']} {entry['dtype']}"
            )
        buf = self._map[self._data_start + begin : self._data_start + end]
        # np.frombuffer on a slice handles unaligned offsets by copying.
        return np.frombuffer(buf.tobytes(), dtype=dt, count=count).reshape(entry["shape"])


def to_float(array, dtype_name):
    """Widens a stored float tensor (BF16/F16/F32/F64) exactly to float64."""
    if dtype_name == "BF16":
        return (array.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    if dtype_name in ("F16", "F32", "F64"):
        return array.astype(np.float64)
    raise ValueError(f"not a float dtype: {dtype_name}")


class Checkpoint:
    """Tensors of a checkpoint directory: one model.safetensors, a sharded set through
    model.safetensors.index.json (shard names are whatever weight_map says), or else every
    *.safetensors file in the directory."""

    def __init__(self, directory):
        self.directory = directory
        index_path = os.path.join(directory, "model.safetensors.index.json")
        if os.path.exists(index_path):
            with open(index_path) as f:
                weight_map = json.load(f)["weight_map"]
            files = {
                shard: SafetensorsFile(os.path.join(directory, shard))
                for shard in set(weight_map.values())
            }
            self._where = {name: files[shard] for name, shard in weight_map.items()}
            for name, file in self._where.items():
                if name not in file._entries:
                    raise ValueError(f"{file.path}: index says it holds {name}, it does not")
        else:
            paths = sorted(p for p in os.listdir(directory) if p.endswith(".safetensors"))
            if not paths:
                raise ValueError(f"{directory}: no .safetensors file")
            self._where = {}
            for p in paths:
                file = SafetensorsFile(os.path.join(directory, p))
                for name in file.names():
                    self._where[name] = file

    def __contains__(self, name):
        return name in self._where

    def names(self):
        return list(self._where)

    def dtype(self, name):
        return self._where[name].dtype(name)

    def shape(self, name):
        return self._where[name].shape(name)

    def raw(self, name):
        return self._where[name].raw(name)

    def float64(self, name):
        return to_float(self.raw(name), self.dtype(name))
