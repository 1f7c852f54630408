"""Our safetensors reader and writer against the Python `safetensors` library.

Files written by `safetensors` must read back in C++ with the same names, dtypes, shapes and
bytes; files written by our writer must load in `safetensors` with equal values. The C++ side is
reached through the `safetensors_dump` test tool (path in $SAFETENSORS_DUMP).
"""

import json
import os
import struct
import subprocess

import numpy as np
import pytest
import torch
from safetensors.numpy import load_file as np_load_file
from safetensors.numpy import save_file as np_save_file
from safetensors.torch import load_file, save_file

DUMP = os.environ.get("SAFETENSORS_DUMP", "")


@pytest.fixture(scope="module", autouse=True)
def _dump_tool():
    assert DUMP and os.path.exists(DUMP), "set SAFETENSORS_DUMP to the safetensors_dump binary"


def dump(path):
    out = subprocess.run([DUMP, str(path)], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def all_dtype_tensors():
    g = torch.Generator().manual_seed(0)
    r = torch.randn(3, 5, generator=g)
    return {
        "bool": torch.tensor([True, False, True]),
        "u8": torch.arange(7, dtype=torch.uint8),
        "i8": torch.tensor([-128, 0, 127], dtype=torch.int8),
        "i16": torch.tensor([[-32768, 1], [2, 32767]], dtype=torch.int16),
        "u16": torch.tensor([0, 65535, 3], dtype=torch.uint16),
        "f16": r.to(torch.float16),
        "bf16": r.to(torch.bfloat16),
        "i32": torch.tensor([-(2**31), 2**31 - 1], dtype=torch.int32),
        "u32": torch.tensor([0, 2**32 - 1], dtype=torch.uint32),
        "f32": r,
        "f64": r.double().reshape(5, 3),
        "i64": torch.tensor([-(2**63), 2**63 - 1, 5], dtype=torch.int64),
        "u64": torch.tensor([0, 2**64 - 1], dtype=torch.uint64),
        "scalar": torch.tensor(2.5),
        "empty": torch.zeros(0, 4),
    }


ST_DTYPE = {
    torch.bool: "BOOL", torch.uint8: "U8", torch.int8: "I8", torch.int16: "I16",
    torch.uint16: "U16", torch.float16: "F16", torch.bfloat16: "BF16", torch.int32: "I32",
    torch.uint32: "U32", torch.float32: "F32", torch.float64: "F64", torch.int64: "I64",
    torch.uint64: "U64",
}  # fmt: skip


def raw_bytes(t):
    return t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()


def test_reads_every_dtype_written_by_safetensors(tmp_path):
    tensors = all_dtype_tensors()
    path = tmp_path / "all.safetensors"
    save_file(tensors, str(path), metadata={"format": "pt", "who": "python"})
    seen = dump(path)
    assert seen["metadata"] == {"format": "pt", "who": "python"}
    by_name = {t["name"]: t for t in seen["tensors"]}
    assert set(by_name) == set(tensors)
    for name, t in tensors.items():
        assert by_name[name]["dtype"] == ST_DTYPE[t.dtype], name
        assert by_name[name]["shape"] == list(t.shape), name
        assert bytes.fromhex(by_name[name]["hex"]) == raw_bytes(t), name


def test_reads_unaligned_layout(tmp_path):
    # Hand-built: tensors packed back to back in caller order behind an unpadded header, as some
    # numpy writers do. `safetensors` itself must accept it too, and agree with us.
    arrays = [
        ("a_u8", np.arange(3, dtype=np.uint8), "U8"),
        ("b_f32", np.array([1.5, -2.25, 3.0], dtype=np.float32), "F32"),
        ("c_i64", np.array([-7, 1 << 40], dtype=np.int64), "I64"),
        ("d_f16", np.array([0.5, 2.0, -1.0], dtype=np.float16), "F16"),
        ("e_f64", np.array([np.pi], dtype=np.float64), "F64"),
    ]
    header, data = {}, b""
    for name, arr, dtype in arrays:
        header[name] = {"dtype": dtype, "shape": list(arr.shape),
                        "data_offsets": [len(data), len(data) + arr.nbytes]}  # fmt: skip
        data += arr.tobytes()
    text = json.dumps(header).encode()
    if (8 + len(text)) % 2 == 0:
        text += b" "  # odd data start: no tensor wider than a byte is aligned
    path = tmp_path / "unaligned.safetensors"
    path.write_bytes(struct.pack("<Q", len(text)) + text + data)

    reference = np_load_file(str(path))
    seen = {t["name"]: t for t in dump(path)["tensors"]}
    for name, arr, dtype in arrays:
        np.testing.assert_array_equal(reference[name], arr)
        assert seen[name]["dtype"] == dtype
        assert seen[name]["shape"] == list(arr.shape)
        assert bytes.fromhex(seen[name]["hex"]) == reference[name].tobytes(), name
    assert any(t["address_mod_8"] % 2 for t in seen.values())


def test_our_writer_loads_in_safetensors(tmp_path):
    tensors = all_dtype_tensors()
    src = tmp_path / "src.safetensors"
    save_file(tensors, str(src), metadata={"format": "pt", "k": "v"})
    ours = tmp_path / "ours.safetensors"
    out = subprocess.run([DUMP, str(src), "--copy", str(ours)], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr

    back = load_file(str(ours))
    assert set(back) == set(tensors)
    for name, t in tensors.items():
        assert back[name].dtype == t.dtype, name
        assert back[name].shape == t.shape, name
        assert torch.equal(back[name], t), name
    from safetensors import safe_open

    with safe_open(str(ours), "pt") as f:
        assert f.metadata() == {"format": "pt", "k": "v"}
    raw = ours.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    assert n % 8 == 0 and raw[8:9] == b"{"
    assert raw[8 : 8 + n].decode().endswith(("}", " "))


def test_numpy_written_file_round_trips_through_our_writer(tmp_path):
    arrays = {"w": np.arange(12, dtype=np.float32).reshape(3, 4), "b": np.array([True, False])}
    src = tmp_path / "np.safetensors"
    np_save_file(arrays, str(src))
    ours = tmp_path / "ours.safetensors"
    subprocess.run([DUMP, str(src), "--copy", str(ours)], check=True)
    back = np_load_file(str(ours))
    for name, arr in arrays.items():
        np.testing.assert_array_equal(back[name], arr)


@pytest.mark.parametrize(
    "corrupt",
    ["truncate_data", "trailing_bytes", "header_past_end", "bad_json"],
)
def test_files_safetensors_rejects_we_reject(tmp_path, corrupt):
    path = tmp_path / "good.safetensors"
    save_file({"w": torch.arange(4, dtype=torch.float32)}, str(path))
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    if corrupt == "truncate_data":
        raw = raw[:-3]
    elif corrupt == "trailing_bytes":
        raw = raw + b"xx"
    elif corrupt == "header_past_end":
        raw = struct.pack("<Q", len(raw)) + raw[8:]
    else:
        raw = raw[:8] + b"[" + raw[9:]
    path.write_bytes(raw)
    with pytest.raises(Exception):
        load_file(str(path))
    out = subprocess.run([DUMP, str(path)], capture_output=True, text=True)
    assert out.returncode == 1
    assert str(path) in out.stderr
