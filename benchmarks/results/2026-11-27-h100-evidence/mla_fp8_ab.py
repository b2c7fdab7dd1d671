"""Interleaved A/B of the Gluon MLA FP8 kernel: old (32-key tiles, separate e4m3 ring) vs new
(64-key tiles widened in place; prefetch distance 0/1/2), bf16 cache of the same shape as the
baseline. CUDA-graph replays of the whole decode (partial + combine). Outputs vs fp64 on the
first sequences and vs old. SHAPES batch:seq:heads[:q_len]."""
import json, os, sys, time, statistics, math
import torch, triton
import tileattn
from tileattn.kernels.mla import sm90, sm90_fp8, _ab_old_sm90_fp8 as old, _ab_head_sm90_fp8 as head
from tileattn.bench.common import spin_up, device_facts, copy_gbps
from tileattn.bench.mla import HEAD_DIM_QK, HEAD_DIM_V, make_cache
from tileattn.reference import mla_decode_reference

SCALE = 1 / math.sqrt(192)
new_launch = sm90_fp8.mla_sm90_fp8_launch
def setv(name):
    sm90.PV_FIRST = name.endswith("-pvf")
    sm90_fp8.PV_FIRST = not name.endswith("-nopvf")
    if name in ("old", "head"):
        sm90_fp8.mla_sm90_fp8_launch = (old if name == "old" else head).mla_sm90_fp8_launch
    else:
        sm90_fp8.mla_sm90_fp8_launch = new_launch
        sm90_fp8.PREFETCH_TILES = int(name.split("-pf")[1][0]) if "-pf" in name else 1
ROUNDS = int(os.environ.get("ROUNDS", 3))
VARIANTS = os.environ.get("VARIANTS", "head new").split()
BF16 = os.environ.get("BF16", "bf16").split()
SHAPES = os.environ.get("SHAPES", "768:2048:64 768:2048:32 768:8192:64 768:2048:128 128:8192:128").split()
spin_up()
copy = copy_gbps()
rows = []
t0 = time.time()
for shape in SHAPES:
    f = [int(x) for x in shape.split(":")]
    batch, seq, heads, q_len = (f + [1])[:4]
    gen = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(batch, q_len, heads, HEAD_DIM_QK, device="cuda", generator=gen, dtype=torch.bfloat16)
    seq_lens = torch.full((batch,), seq, dtype=torch.int32, device="cuda")
    flops = 2 * heads * q_len * (HEAD_DIM_QK + HEAD_DIM_V) * batch * seq
    calls, refs = {}, {}
    for kv_name in ("fp8", "bf16"):
        kv, pt, desc = make_cache(batch, seq, 64, kv_name, "cuda", gen)
        plan = tileattn.mla_plan(seq_lens, num_heads=heads, q_len=q_len, page_size=64, kv_dtype=kv.dtype, device="cuda")
        assert plan.kernel == "gluon", plan.kernel
        def call(kv=kv, pt=pt, desc=desc, plan=plan):
            return tileattn.mla_decode(q, kv, pt, seq_lens, plan=plan, softmax_scale=SCALE, kv_descale=desc)
        exp, _ = mla_decode_reference(q[:2], kv, pt[:2], seq_lens[:2], softmax_scale=SCALE, kv_descale=desc)
        refs[kv_name] = exp
        if kv_name == "bf16":
            for v in BF16:
                calls[v] = call
        else:
            for v in VARIANTS:
                calls[v] = call
    row = dict(batch=batch, seq_len=seq, heads=heads, q_len=q_len)
    outs = {}
    for name, call in calls.items():
        setv(name)
        o = call().float()
        torch.cuda.synchronize()
        ref = refs["bf16" if name.startswith("bf16") else "fp8"]
        err = float((o[:2].double() - ref).norm() / ref.norm())
        outs[name] = o
        row[name] = dict(err_fp64=err, finite=bool(torch.isfinite(o).all()))
    for name in VARIANTS[1:] + BF16[1:]:
        row[name]["max_diff_vs_old"] = float((outs[name] - outs[(BF16 if name.startswith("bf16") else VARIANTS)[0]]).abs().max())
    times = {n: [] for n in calls}
    names = list(calls)
    for r in range(ROUNDS):
        for name in (names if r % 2 == 0 else names[::-1]):
            setv(name)
            call = calls[name]
            call()
            times[name].append(triton.testing.do_bench_cudagraph(call, rep=200, return_mode="median"))
    for name in names:
        ms = statistics.median(times[name])
        row[name].update(ms=ms, ms_rounds=times[name], tflops=flops / ms / 1e9)
    print(shape, "  ".join(f"{n} {row[n]['ms']:.4f}ms {row[n]['tflops']:.0f}TF err {row[n]['err_fp64']:.2e}"
                          + f" d {row[n].get('max_diff_vs_old', 0):.1e}" for n in names),
          f"| new/bf16 {row['bf16']['ms']/row['new']['ms']:.3f}x head/bf16 {row['bf16']['ms']/row['head']['ms']:.3f}x new/head {row['head']['ms']/row['new']['ms']:.3f}x",
          f"[{time.time()-t0:.0f}s]", flush=True)
    rows.append(row)
    del calls, refs, outs
    torch.cuda.empty_cache()
out = os.environ.get("OUT", ".")
json.dump(dict(device_facts(), copy_gbps=copy, rows=rows), open(os.path.join(out, "mla-fp8-ab.json"), "w"), indent=1)
