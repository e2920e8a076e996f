"""safetensors files for tools/reference, with either of safetensors' serialize_file APIs.

The low-level `serialize_file` changed its argument in safetensors 0.8: before, each tensor is a
dict holding its bytes ({"dtype", "shape", "data"}); from 0.8 on it is a `safetensors.TensorSpec`
that points at the tensor's memory (dtype, shape, data_ptr, data_len). The setup venv pins 0.6.2;
a lent GPU machine has 0.8, so both are spoken. `safetensors.torch` is not used because it
imports `packaging`, which the venv lacks.
"""
import ctypes

import safetensors
from safetensors import safe_open, serialize_file

# None before safetensors 0.8 (the dict API).
TENSOR_SPEC = getattr(safetensors, "TensorSpec", None)


def tensor_entries(tensors, tensor_spec):
    """The `serialize_file` argument for a dict of tensors, and the tensors it reads from.

    `tensor_spec` is safetensors.TensorSpec (0.8 API) or None (the dict API). TensorSpec entries
    point into the returned tensors, which must stay alive until serialize_file returns.
    """
    entries, keep_alive = {}, []
    for name, t in tensors.items():
        t = t.detach().cpu().contiguous()
        dtype = str(t.dtype).removeprefix("torch.")
        shape = list(t.shape)
        nbytes = t.numel() * t.element_size()
        if tensor_spec is None:
            # one memory copy (iterating the storage in Python takes seconds per MB)
            data = ctypes.string_at(t.data_ptr(), nbytes) if nbytes else b""
            entries[name] = {"dtype": dtype, "shape": shape, "data": data}
        else:
            keep_alive.append(t)
            entries[name] = tensor_spec(dtype=dtype, shape=shape, data_ptr=t.data_ptr(),
                                        data_len=nbytes)
    return entries, keep_alive


def save_tensors(path, tensors, metadata=None, serialize=serialize_file, tensor_spec=TENSOR_SPEC):
    """Writes `tensors` (name -> tensor, any device) to `path`; errors propagate."""
    entries, keep_alive = tensor_entries(tensors, tensor_spec)
    serialize(entries, path, metadata=metadata)
    del keep_alive  # only now may the memory the entries point at go


def load_tensors(path):
    """name -> CPU tensor; errors propagate."""
    with safe_open(path, framework="pt") as f:
        return {k: f.get_tensor(k) for k in f.keys()}
