"""One prefill shape for a profiler: python benchmarks/prefill_profile.py D DTYPE N CAUSAL IMPL.

DTYPE is a column of the prefill grid (bf16, fp8e4m3, fp8e4m3-vT, ...), CAUSAL 0/1, IMPL
tileattn (attention()'s own choice), portable, sm90 (TILEATTN_KERNEL forces the kernel) or
cudnn. Runs the call three times (compile, warm, profiled) at B=4, H=32, e.g.
    ncu --launch-skip 2 --launch-count 1 -k regex:attention python benchmarks/prefill_profile.py 128 fp8e4m3-vT 16384 0 portable
"""

import os
import sys

import torch

from tileattn.bench import prefill

head_dim, column, context, causal, impl = (int(sys.argv[1]), sys.argv[2], int(sys.argv[3]),
                                           bool(int(sys.argv[4])), sys.argv[5])
if impl in ("portable", "sm90"):
    os.environ["TILEATTN_KERNEL"] = impl
table = prefill.providers()
prepare, call = table[("cudnn" if impl == "cudnn" else "tileattn", column)]
gen = torch.Generator(device="cuda").manual_seed(0)
shape = (prefill.BATCH, context, prefill.HEADS, head_dim)
q, k, v = (torch.randn(shape, device="cuda", generator=gen) for _ in range(3))
args, kwargs = prepare(q, k, v)
for _ in range(3):
    call(*args, causal, **kwargs)
torch.cuda.synchronize()
print("profiled", head_dim, column, context, causal, impl)
