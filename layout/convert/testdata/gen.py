"""Writes vectors.safetensors: inputs (but the 16-bit ones: every pattern,
in order) and torch's own Tensor.to results for
every conversion layout/convert implements (torch 2.15, CPU). Run with the
e2e venv: python layout/convert/testdata/gen.py"""
import os

import torch
from safetensors.torch import save_file

g = torch.Generator().manual_seed(0)
special = torch.tensor([0, 0x80000000, 0x7f800000, 0xff800000, 0x7f800001, 0xff812345, 0x7fc00000, 0x7fffffff,
                        0x00000001, 0x807fffff, 0x33000000, 0x33000001, 0x387fc000, 0x387fe000, 0x38800000,
                        0x477fe000, 0x477fefff, 0x477ff000, 0x477ff001, 0x3f808000, 0x3f818000, 0x3f80c000],
                       dtype=torch.int64).to(torch.int32)
rand_bits = torch.randint(-2**31, 2**31, (4000,), generator=g, dtype=torch.int64).to(torch.int32)
# values near the half range, so its normal/subnormal/overflow edges are hit
near = (torch.rand(4000, generator=g, dtype=torch.float64) * 40 - 28).exp2().to(torch.float32)
near = near * torch.where(torch.rand(4000, generator=g) < 0.5, -1.0, 1.0)
f32 = torch.cat([special.view(torch.float32), rand_bits.view(torch.float32), near])
all16 = torch.arange(0, 65536, dtype=torch.int32).to(torch.int16)
f64 = torch.cat([torch.randn(5000, generator=g, dtype=torch.float64) * 1e3,
                 torch.tensor([1e300, -1e300, 1e-300, float("inf"), float("nan")], dtype=torch.float64)])
out = {
    "f32": f32,
    "f32_to_bf16": f32.to(torch.bfloat16),
    "f32_to_f16": f32.to(torch.float16),
    # inputs: every 16-bit pattern, in order (the test makes them itself)
    "bf16_to_f16": all16.view(torch.bfloat16).to(torch.float16),
    "f16_to_f32": all16.view(torch.float16).to(torch.float32),
    "f16_to_bf16": all16.view(torch.float16).to(torch.bfloat16),
    "f64": f64,
    "f64_to_f32": f64.to(torch.float32),
    "f64_to_bf16": f64.to(torch.bfloat16),
    "f64_to_f16": f64.to(torch.float16),
}
save_file(out, os.path.join(os.path.dirname(os.path.abspath(__file__)), "vectors.safetensors"),
          metadata={"torch": torch.__version__, "cpu": torch.backends.cpu.get_cpu_capability()})
