"""A/B: FP8 P carried across the Hopper key loop packed as e4m3 quads in int32 (sm90.FP8_PACKED_P)
vs fp32 (packed where P V issues: 16 PRMT a step), interleaved rounds; V row-major, its grouped
K-major copy timed. cuDNN FP8 and bf16 in the same rounds."""
import json, os, sys, time
import torch, triton
import tileattn
from tileattn.bench.common import device_facts, spin_up
from tileattn.kernels.attention import sm90
from tileattn.ops import call_cache
from tileattn.bench import prefill
E4M3 = torch.float8_e4m3fn
ROUNDS = int(os.environ.get("ROUNDS", "3"))
points = [(128, 16384, False), (128, 16384, True), (128, 4096, False), (128, 4096, True),
          (256, 16384, False), (256, 16384, True), (64, 16384, False), (128, 1024, False)]
B, H = 4, 32
try:
    cudnn_fp8 = prefill._cudnn_fp8()
except Exception as e:
    print("no cudnn fp8", e); cudnn_fp8 = None
spin_up()
rows = []; t0 = time.time()
for D, N, causal in points:
    torch.manual_seed(0)
    q, k, v = (torch.randn(B, N, H, D, device="cuda") for _ in range(3))
    (q8, qd), (k8, kd), (v8, vd) = (tileattn.quantize_fp8(x, E4M3) for x in (q, k, v))
    d = dict(q_descale=qd, k_descale=kd, v_descale=vd)
    flops = 4 * B * H * N * N * D / (2 if causal else 1)
    impls = {"fp32-carry": (lambda: tileattn.attention(q8, k8, v8, causal=causal, **d), False),
             "packed": (lambda: tileattn.attention(q8, k8, v8, causal=causal, **d), True)}
    if cudnn_fp8 is not None:
        impls["cudnn-fp8"] = (lambda: cudnn_fp8(q8, k8, v8, causal, **d), None)
    outs, tf = {}, {n: [] for n in impls}
    names = list(impls)
    for r in range(ROUNDS):
        for name in (names if r % 2 == 0 else names[::-1]):
            fn, var = impls[name]
            if var is not None:
                sm90.FP8_PACKED_P = var
                call_cache.clear_all()
            out = fn(); torch.cuda.synchronize()
            if r == 0 and var is not None:
                outs[name] = out.float()
            tf[name].append(round(flops / triton.testing.do_bench(fn, warmup=50, rep=300) / 1e9))
    ref = outs["fp32-carry"]
    row = dict(D=D, N=N, causal=causal, equal=torch.equal(outs["packed"], ref),
               max_diff=(outs["packed"] - ref).abs().max().item(), **tf)
    print(round(time.time() - t0), row, flush=True)
    rows.append(row)
sm90.FP8_PACKED_P = True
json.dump(dict(device_facts(), rows=rows), open(os.path.join(os.environ.get("OUT", "."), "fp8-packed-p-ab.json"), "w"), indent=1)
