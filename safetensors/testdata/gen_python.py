"""Writes python_*.safetensors with the real Python safetensors library.

Run from safetensors/: ../e2e/.venv/bin/python testdata/gen_python.py
(made with safetensors 0.8.0 and numpy). The files are committed; the Go
tests only read them.
"""
import numpy as np
import safetensors
import safetensors.numpy

np.random.seed(0)
safetensors.numpy.save_file(
    {
        "model.embed.weight": np.arange(12, dtype=np.float32).reshape(3, 4),
        "model.norm.weight": np.ones(4, dtype=np.float16),
        "model.layers.0.attn.bias": np.zeros((0, 4), dtype=np.float32),
        "step": np.array(7, dtype=np.int64),
        "mask": np.array([True, False, True]),
        "ids": np.arange(5, dtype=np.uint8),
        "scores": np.linspace(0, 1, 6, dtype=np.float64).reshape(2, 3),
    },
    "testdata/python_numpy.safetensors",
    metadata={"format": "np"},
)

# dtypes numpy lacks, through the raw TensorSpec API; odd tensor names.
specs = {
    "bf16": ("bfloat16", [2, 3], 12),
    "fp8": ("float8_e4m3fn", [4], 4),
    "fp8_e5m2": ("float8_e5m2", [2, 2], 4),
    "c64": ("complex64", [1], 8),
    'quote"back\\slash\nnewline': ("int32", [2], 8),
    "ünïcødé/😀": ("uint16", [3], 6),
    "ctrl\x01\x7f": ("int8", [], 1),
}
keep = []
tensors = {}
for name, (dtype, shape, n) in specs.items():
    buf = np.frombuffer(bytes(range(n)), dtype=np.uint8).copy()
    keep.append(buf)
    tensors[name] = safetensors.TensorSpec(dtype=dtype, shape=shape, data_ptr=buf.ctypes.data, data_len=n)
safetensors.serialize_file(tensors, "testdata/python_raw.safetensors", metadata=None)
