"""FP8 P's row sums on the tensor cores (sm90.FP8_ROW_SUM_DIMS, ROW_SUM_MMA) vs FADD sums: errors
against fp64 on odd shapes (both variants), then B=4 H=32 D=128 e4m3 per tensor, V row-major (its
copy timed, as fp8.json's tileattn-fp8 column), cuDNN FP8 in the same rounds, 5 interleaved."""
import json, os, statistics, sys, math
import torch, triton
import tileattn
from tileattn.kernels.attention import sm90
from tileattn.ops import call_cache
from tileattn.reference import attention_reference
from tileattn.bench import prefill
from tileattn.bench.common import spin_up, device_facts
ROUNDS = int(os.environ.get("ROUNDS", 5))
E4M3 = torch.float8_e4m3fn
def set_rs(on):
    sm90.FP8_ROW_SUM_DIMS = (128,) if on else ()
    call_cache.clear_all()
def quant(q, k, v):
    (q8, qd), (k8, kd), (v8, vd) = (tileattn.quantize_fp8(x, E4M3) for x in (q, k, v))
    return (q8, k8, v8), dict(q_descale=qd, k_descale=kd, v_descale=vd)
errors = []
for (b, hq, hkv, sq, sk, d, causal) in [(2, 8, 2, 1000, 1537, 128, True), (1, 4, 4, 777, 777, 128, False),
                                        (2, 4, 4, 4096, 4096, 96, True), (1, 8, 8, 300, 2000, 128, True)]:
    gen = torch.Generator(device="cuda").manual_seed(sq + d)
    q = torch.randn(b, sq, hq, d, device="cuda", generator=gen)
    k = torch.randn(b, sk, hkv, d, device="cuda", generator=gen)
    v = torch.randn(b, sk, hkv, d, device="cuda", generator=gen)
    (q8, k8, v8), ds = quant(q, k, v)
    ref = attention_reference(q8, k8, v8, causal=causal, **ds)[0].double()
    row = dict(shape=[b, hq, hkv, sq, sk, d], causal=causal)
    for on in (False, True):
        set_rs(on)
        with tileattn.use_kernels(attention="sm90"):
            out = tileattn.attention(q8, k8, v8, causal=causal, **ds).double()
        row["rs" if on else "fadd"] = float((out - ref).norm() / ref.norm())
    print("error", row, flush=True); errors.append(row)
try:
    cudnn_fp8 = prefill._cudnn_fp8()
except Exception as e:
    print("no cudnn fp8", e); cudnn_fp8 = None
spin_up()
rows = []
for n in (16384, 4096, 1024):
    for causal in (False, True):
        gen = torch.Generator(device="cuda").manual_seed(n)
        q, k, v = (torch.randn(4, n, 32, 128, device="cuda", generator=gen, dtype=torch.bfloat16) for _ in range(3))
        (q8, k8, v8), ds = quant(q, k, v)
        calls = {}
        for on in (False, True):
            def call(on=on):
                return tileattn.attention(q8, k8, v8, causal=causal, **ds)
            calls["rs" if on else "fadd"] = (on, call)
        if cudnn_fp8 is not None:
            calls["cudnn"] = (None, lambda: cudnn_fp8(q8, k8, v8, causal, **ds))
        outs = {}
        for name, (on, c) in calls.items():
            if on is not None: set_rs(on)
            outs[name] = c()
        diff = float((outs["rs"].float() - outs["fadd"].float()).norm() / outs["fadd"].float().norm())
        times = {name: [] for name in calls}
        names = list(calls)
        for r in range(ROUNDS):
            for name in (names if r % 2 == 0 else names[::-1]):
                on, c = calls[name]
                if on is not None: set_rs(on)
                c()
                times[name].append(triton.testing.do_bench(c, warmup=25, rep=200, return_mode="median"))
        flops = 4 * 4 * 32 * n * n * 128 / (2 if causal else 1)
        row = dict(N=n, causal=causal, rs_vs_fadd_rel=diff,
                   **{f"{k}_ms": statistics.median(t) for k, t in times.items()},
                   **{f"{k}_rounds": t for k, t in times.items()})
        for k in times: row[f"{k}_tflops"] = flops / row[f"{k}_ms"] / 1e9
        print(f"N={n} causal={causal} " + " ".join(f"{k} {row[k+'_tflops']:.0f}" for k in times)
              + f"  rs/fadd {row['fadd_ms']/row['rs_ms']:.3f}x" + (f" rs/cudnn {row['cudnn_ms']/row['rs_ms']:.3f}x fadd/cudnn {row['cudnn_ms']/row['fadd_ms']:.3f}x" if 'cudnn_ms' in row else "") + f" diff {diff:.1e}", flush=True)
        rows.append(row)
        del q, k, v, q8, k8, v8, outs
json.dump(dict(device_facts(), errors=errors, rows=rows), open(os.path.join(os.environ.get("OUT", "."), "fp8-rowsum-ab.json"), "w"), indent=1)
