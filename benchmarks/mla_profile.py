"""One MLA decode shape for a profiler: python benchmarks/mla_profile.py HEADS {bf16,fp8} [BATCH SEQ].

Runs the call three times (compile, warm, profiled); profile the last partial-kernel launch:
    ncu --launch-skip 2 --launch-count 1 -k regex:mla_decode_partial python benchmarks/mla_profile.py 16 fp8
"""

import sys

import torch

import tileattn
from tileattn.bench.mla import _make_cache

heads, kv_name = int(sys.argv[1]), sys.argv[2]
batch, seq_len = (int(sys.argv[3]), int(sys.argv[4])) if len(sys.argv) > 4 else (768, 2048)
device = torch.device("cuda")
gen = torch.Generator(device=device).manual_seed(0)
kv_cache, page_table, kv_descale = _make_cache(batch, seq_len, 64, kv_name, device, gen)
q = torch.randn(batch, 1, heads, 576, device=device, generator=gen, dtype=torch.bfloat16)
seq_lens = torch.full((batch,), seq_len, dtype=torch.int32, device=device)
plan = tileattn.mla_plan(seq_lens, num_heads=heads, page_size=64, kv_dtype=kv_cache.dtype,
                         device=device)
for _ in range(3):
    tileattn.mla_decode(q, kv_cache, page_table, seq_lens, softmax_scale=0.07,
                        kv_descale=kv_descale, plan=plan)
torch.cuda.synchronize()
print("profiled", heads, kv_name, batch, seq_len, "work items", plan.num_work)
