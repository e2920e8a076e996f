#!/usr/bin/env python3
"""safetensors_io writes readable files through both serialize_file APIs.

The dict API (safetensors < 0.8) and the TensorSpec API (0.8 and later) are both exercised,
whichever safetensors is installed: the API that is not installed is played by a fake
serialize_file that behaves as the real one does (rejects the other API's entries, reads the
tensors' memory during the call and writes a real safetensors file), and the installed
safe_open reads each file back. Then one round trip through the installed safetensors.
Exit status 0 and "safetensors_io tests passed" on success.
"""
import ctypes
import json
import os
import struct
import sys
import tempfile
import warnings

warnings.filterwarnings("ignore", message=".*Failed to initialize NumPy.*")
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import safetensors  # noqa: E402
import safetensors_io  # noqa: E402

CODES = {"float32": "F32", "bfloat16": "BF16", "int64": "I64", "float16": "F16", "int32": "I32"}


class FakeTensorSpec:
    """safetensors 0.8's TensorSpec: keyword-only dtype, shape, data_ptr, data_len."""

    def __init__(self, *, dtype, shape, data_ptr, data_len):
        assert dtype in CODES, f"unknown dtype {dtype}"
        self.dtype, self.shape, self.data_ptr, self.data_len = dtype, list(shape), data_ptr, data_len


def write_file(path, named_bytes, metadata):
    """A safetensors file: 8-byte little-endian header length, JSON header, then the data."""
    header, offset = {}, 0
    for name, (dtype, shape, data) in named_bytes.items():
        header[name] = {"dtype": CODES[dtype], "shape": shape, "data_offsets": [offset, offset + len(data)]}
        offset += len(data)
    if metadata:
        header["__metadata__"] = metadata
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(raw)) + raw)
        for _, _, data in named_bytes.values():
            f.write(data)


def fake_serialize_file_dicts(entries, path, metadata=None):
    """safetensors < 0.8: each entry a dict with the bytes."""
    for name, e in entries.items():
        if not isinstance(e, dict):
            raise TypeError(f"argument 'tensor_dict': '{type(e).__name__}' is not a dict")
        assert set(e) == {"dtype", "shape", "data"}, f"{name}: {sorted(e)}"
    write_file(path, {k: (e["dtype"], e["shape"], e["data"]) for k, e in entries.items()}, metadata)


def fake_serialize_file_specs(entries, path, metadata=None):
    """safetensors 0.8: each entry a TensorSpec; the memory is read during the call."""
    for e in entries.values():
        if not isinstance(e, FakeTensorSpec):
            raise TypeError(f"argument 'tensor_dict': '{type(e).__name__}' object is not an instance "
                            "of 'TensorSpec'")
    write_file(path, {k: (e.dtype, e.shape, ctypes.string_at(e.data_ptr, e.data_len))
                      for k, e in entries.items()}, metadata)


def sample_tensors():
    torch.manual_seed(0)
    base = torch.randn(6, 8)
    return {
        "weight": torch.randn(4, 3),
        "view": base[1:5, 2:7],                 # not contiguous: a slice of a larger storage
        "transposed": base.t(),                  # not contiguous either
        "ids": torch.arange(10, dtype=torch.int64).reshape(2, 5),
        "half": torch.randn(5, dtype=torch.bfloat16),
        "scalar": torch.tensor([3.5]),
    }


def check_round_trip(path, tensors, metadata):
    back = safetensors_io.load_tensors(path)
    assert set(back) == set(tensors), sorted(back)
    for name, t in tensors.items():
        assert back[name].dtype == t.dtype and back[name].shape == t.shape, name
        assert torch.equal(back[name], t), name
    with safetensors.safe_open(path, framework="pt") as f:
        assert f.metadata() == metadata, f.metadata()


def test_api(label, serialize, tensor_spec, tmp):
    tensors = sample_tensors()
    metadata = {"producer": "test_safetensors_io", "api": label}
    path = os.path.join(tmp, f"{label}.safetensors")
    safetensors_io.save_tensors(path, tensors, metadata, serialize=serialize, tensor_spec=tensor_spec)
    check_round_trip(path, tensors, metadata)
    print(f"ok: {label}")


def test_entries_match_api():
    tensors = sample_tensors()
    specs, keep = safetensors_io.tensor_entries(tensors, FakeTensorSpec)
    assert all(isinstance(e, FakeTensorSpec) for e in specs.values())
    kept = {t.data_ptr() for t in keep}
    assert all(e.data_ptr in kept for e in specs.values()), "specs point into the kept tensors"
    assert specs["view"].shape == [4, 5] and specs["view"].data_len == 4 * 5 * 4
    assert specs["half"].dtype == "bfloat16" and specs["half"].data_len == 10
    dicts, keep = safetensors_io.tensor_entries(tensors, None)
    assert keep == [] and all(isinstance(e["data"], bytes) for e in dicts.values())
    # A mismatched pair is what broke the reference on safetensors 0.8: the fakes reject it.
    for serialize, spec in ((fake_serialize_file_specs, None), (fake_serialize_file_dicts, FakeTensorSpec)):
        try:
            serialize(safetensors_io.tensor_entries(tensors, spec)[0], os.devnull)
            raise AssertionError(f"{serialize.__name__} accepted the other API's entries")
        except TypeError:
            pass
    print("ok: entries for each API")


def main():
    installed = "TensorSpec" if safetensors_io.TENSOR_SPEC is not None else "dicts"
    print(f"safetensors {safetensors.__version__} installed ({installed} API)")
    test_entries_match_api()
    with tempfile.TemporaryDirectory() as tmp:
        test_api("dicts", fake_serialize_file_dicts, None, tmp)
        test_api("tensorspec", fake_serialize_file_specs, FakeTensorSpec, tmp)
        test_api("installed", safetensors.serialize_file, safetensors_io.TENSOR_SPEC, tmp)
    print("safetensors_io tests passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
