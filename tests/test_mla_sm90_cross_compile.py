"""Compile the Gluon MLA decode kernels (tileattn/kernels/mla_sm90.py, and mla_sm90_fp8.py for
an e4m3 cache) for sm_90a without a GPU.

Proves they fit 227 KB of shared memory, run both GEMMs on wgmma fed by TMA, raise the
consumer warpgroups' registers with setmaxnreg, and spill nothing (no stack frame, no
local-memory instructions), for the shapes they take: 64 and 128 rows, q_len 1 and 2, bf16 and
fp16, 16-bit and e4m3 caches; and that the e4m3 -> bf16 widening uses no conversion
instruction (the integer bit move of sm90_fp8.py). Which plans run these kernels is
tests/test_dispatch.py's.
"""

from .compile_helpers import run_without_interpreter

CHILD = r'''
import json, os, re, subprocess, tempfile, torch, triton
from tileattn import scheduler
from tileattn.arch import arch_for_capability
from tileattn.kernels.mla import decode as mla, sm90 as mla_sm90, sm90_fp8 as mla_sm90_fp8
from tileattn.kernels.compile import cross_compile_sm90

CUOBJDUMP = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
SM90 = arch_for_capability((9, 0))

def inputs(num_heads, q_len, dtype=torch.bfloat16, kv_dtype=None, page_size=64, schedule=None):
    batch, lengths = 2, [200, 100]
    q = torch.empty(batch, q_len, num_heads, 576, dtype=dtype)
    kv = torch.empty(8, page_size, 576, dtype=kv_dtype or dtype)
    page_table = torch.zeros(batch, 4, dtype=torch.int32)
    seq_lens = torch.tensor(lengths, dtype=torch.int32)
    config = mla.config_for(SM90, schedule, num_heads * q_len)
    plan = scheduler.make_mla_plan(lengths, num_heads=num_heads, q_len=q_len, page_size=page_size,
        kv_dtype=kv.dtype, head_dim_v=512,
        programs_per_item=mla.programs_per_work_item(config, num_heads * q_len), num_sms=132,
        block_n=config.block_n, min_chunk=64, device="cpu", config=config, kernel="gluon")
    out = torch.empty(batch, q_len, num_heads, 512, dtype=dtype)
    lse = torch.empty(batch, q_len, num_heads)
    return q, kv, page_table, seq_lens, out, lse, plan

def compile_case(num_heads, q_len, dtype, kv_dtype=None):
    q, kv, page_table, seq_lens, out, lse, plan = inputs(num_heads, q_len, dtype, kv_dtype)
    assert mla_sm90.supports_plan(num_heads * q_len, kv.shape[1], kv.dtype)
    mla_sm90.check_inputs(q, kv)
    if kv.dtype == torch.float8_e4m3fn:
        launch = mla_sm90_fp8.mla_sm90_fp8_launch(q, kv, page_table, seq_lens,
                                                  torch.ones((), dtype=torch.float32), out, lse,
                                                  plan, 0.1)
    else:
        launch = mla_sm90.mla_sm90_launch(q, kv, page_table, seq_lens, out, lse, plan, 0.1)
    c = cross_compile_sm90(launch, 90)
    ptx = c.asm["ptx"]
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(c.asm["cubin"]); f.flush()
        usage = subprocess.run([CUOBJDUMP, "-res-usage", f.name], capture_output=True, text=True).stdout
        sass = subprocess.run([CUOBJDUMP, "-sass", f.name], capture_output=True, text=True).stdout
    return {"shared": c.metadata.shared, "wgmma": ptx.count("wgmma.mma_async"),
            "tma": ptx.count("cp.async.bulk.tensor"),
            "l2_prefetch": ptx.count("cp.async.bulk.prefetch.L2"),
            "stack": int(re.search(r"STACK:(\d+)", usage).group(1)),
            "local": len(re.findall(r"ld\.local|st\.local", ptx)) + len(re.findall(r"\b(LDL|STL)\b", sass)),
            "hgmma": sass.count("HGMMA"),
            "f2f_bf16": sass.count("F2F.BF16"),
            "setmaxnreg": sorted(set(re.findall(r"setmaxnreg\.inc\.sync\.aligned\.u32\s+(\d+)", ptx)))}

rows = {}
for num_heads, q_len, dtype in ((64, 1, torch.bfloat16), (128, 1, torch.bfloat16),
                                (64, 2, torch.bfloat16), (128, 1, torch.float16),
                                (32, 1, torch.bfloat16)):
    rows[f"h{num_heads}-q{q_len}-{str(dtype)[6:]}"] = compile_case(num_heads, q_len, dtype)
for num_heads, dtype in ((64, torch.bfloat16), (128, torch.float16)):
    rows[f"fp8-h{num_heads}-{str(dtype)[6:]}"] = compile_case(num_heads, 1, dtype,
                                                               torch.float8_e4m3fn)

print(json.dumps({"rows": rows}))
'''


def test_mla_sm90_compiles_fits_and_uses_wgmma_tma():
    result = run_without_interpreter(CHILD)
    for name, row in result["rows"].items():
        assert row["shared"] <= 227 * 1024, (name, row)
        assert row["wgmma"] > 0 and row["hgmma"] > 0 and row["tma"] > 0, (name, row)
        assert row["stack"] == 0 and row["local"] == 0, (name, row)   # no register spills
        assert "256" in row["setmaxnreg"], (name, row)                 # softmax warpgroup
        # 16-bit cache: L2 prefetch only where a work item has 2+ row blocks (it slowed
        # 64-row items); e4m3: always (a tile's load waits for its stage's release).
        assert (row["l2_prefetch"] > 0) == name.startswith(("h128", "h64-q2", "fp8")), (name, row)
    assert result["rows"]["fp8-h64-bfloat16"]["f2f_bf16"] == 0   # widened by integer ops
