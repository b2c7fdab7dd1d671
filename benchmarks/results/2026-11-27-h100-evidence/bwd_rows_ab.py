"""How close the backward's row kernels (preprocess: delta + zeroing dq_accum; dQ convert) run
to the copy rate, per rows-per-program and warps; whole backward timed with each setting."""
import dataclasses, json, math, os, torch, triton
from tileattn.arch import arch_of
from tileattn.kernels.attention import bwd
from tileattn.ops import call_cache
from tileattn.bench.common import spin_up, device_facts
import tileattn
dev = torch.device("cuda"); arch = arch_of(dev); spin_up()
OUT = os.environ.get("OUT", ".")
bench = lambda f: triton.testing.do_bench(f, warmup=25, rep=200)
rows_out = []
src = torch.empty(4, 4096, 32, 128, device=dev, dtype=torch.float32).normal_()
dst = torch.empty_like(src)
copy_ms = bench(lambda: dst.copy_(src))
copy_gbps = 2 * src.numel() * 4 / copy_ms / 1e6
print("copy GB/s", round(copy_gbps), flush=True)
SETTINGS = [(64, 4), (128, 4), (128, 8), (32, 4), (64, 8)]
for D, causal in ((128, False), (64, False), (128, True)):
    N = 4096
    gen = torch.Generator(device=dev).manual_seed(D)
    q, k, v, do = (torch.randn(4, N, 32, D, device=dev, generator=gen, dtype=torch.bfloat16) for _ in range(4))
    out, lse = tileattn.attention(q, k, v, causal=causal, return_lse=True)
    dq, dk, dv = (torch.empty_like(x) for x in (q, k, v))
    opts = dict(causal=causal, softmax_scale=1 / math.sqrt(D), window_left=-1, window_right=-1,
                arch=arch, kernel="sm90")
    per = {}
    for rows, warps in SETTINGS:
        bwd.ROWS_PER_PROGRAM["sm90"] = rows
        delta, dq_accum = bwd.backward_workspace(q, lse, False)
        launches = bwd.backward_launches(q, k, v, out, lse, do, dq, dk, dv, delta, dq_accum, **opts)
        pre, main, conv = launches
        pre = dataclasses.replace(pre, num_warps=warps)
        conv = dataclasses.replace(conv, num_warps=warps)
        t_pre, t_conv = bench(pre.run), bench(conv.run)
        pre_bytes = 2 * q.numel() * 2 + q.numel() * 4 + lse.numel() * 4
        conv_bytes = q.numel() * 4 + q.numel() * 2
        per[(rows, warps)] = (pre, main, conv)
        row = dict(D=D, causal=causal, rows=rows, warps=warps, pre_ms=t_pre, conv_ms=t_conv,
                   pre_gbps=pre_bytes / t_pre / 1e6, conv_gbps=conv_bytes / t_conv / 1e6, copy_gbps=copy_gbps)
        print({k: (round(v, 4) if isinstance(v, float) else v) for k, v in row.items()}, flush=True)
        rows_out.append(row)
    # whole backward, settings interleaved in rotated rounds
    names = list(per)
    whole = {n: [] for n in names}
    for r in range(4):
        order = names[r % len(names):] + names[:r % len(names)]
        for n in order:
            pre, main, conv = per[n]
            whole[n].append(bench(lambda: (pre.run(), main.run(), conv.run())))
    flops = 2.5 * 4 * 4 * 32 * N * N * D * (0.5 if causal else 1)
    summary = {f"{n[0]}x{n[1]}": round(flops / (sorted(v)[len(v) // 2]) / 1e9, 1) for n, v in whole.items()}
    print("whole backward TFLOP/s (median of 4 rounds)", D, causal, summary, flush=True)
    rows_out.append(dict(D=D, causal=causal, whole_ms=whole and {f"{n[0]}x{n[1]}": v for n, v in whole.items()}, whole_tflops=summary))
bwd.ROWS_PER_PROGRAM.pop("sm90", None)
json.dump(dict(device_facts(), rows=rows_out), open(os.path.join(OUT, "bwd-rows-ab.json"), "w"), indent=1)
