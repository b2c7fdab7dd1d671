"""FP8 on the Gluon Hopper kernel vs the portable kernel (and cuDNN FP8, bf16), same process,
interleaved rounds; V row-major (the per-call K-major copy is timed). argv: rounds, points."""
import json, os, sys, time, dataclasses
import torch, triton
import tileattn
from tileattn.kernels.attention import sm90
from tileattn.ops import call_cache
from tileattn.ops import attention as attention_op
from tileattn.bench import prefill
from tileattn.reference import attention_reference

E4M3 = torch.float8_e4m3fn
rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 2
points = [(128, 4096, False), (128, 4096, True), (128, 16384, False), (128, 16384, True),
          (256, 16384, False), (256, 16384, True), (128, 1024, False), (128, 1024, True),
          (256, 4096, False), (64, 16384, False), (256, 4096, True)]
if len(sys.argv) > 2:
    points = [p for i, p in enumerate(points) if str(i) in sys.argv[2].split(",")]
B, H = 4, 32
try:
    cudnn_fp8 = prefill._cudnn_fp8()
except Exception as e:
    print("no cudnn fp8", e); cudnn_fp8 = None
STAGE_VARIANTS = {128: (3, 2), 256: (3, 2)}
base = dict(sm90.FP8_CONFIGS)
rows = []
results = {}
for D, N, causal in points:
    torch.manual_seed(0)
    q, k, v = (torch.randn(B, N, H, D, device="cuda") for _ in range(3))
    (q8, qd), (k8, kd), (v8, vd) = (tileattn.quantize_fp8(x, E4M3) for x in (q, k, v))
    d = dict(q_descale=qd, k_descale=kd, v_descale=vd)
    qb, kb, vb = (x.bfloat16() for x in (q, k, v))
    flops = 4 * B * H * N * N * D / (2 if causal else 1)
    impls = {}
    def portable():
        with tileattn.use_kernels(attention="portable"):
            return tileattn.attention(q8, k8, v8, causal=causal, **d)
    impls["portable"] = (portable, None)
    for grouped in (False, True):
        def gl():
            with tileattn.use_kernels(attention="sm90"):
                return tileattn.attention(q8, k8, v8, causal=causal, **d)
        impls["gluon-grouped" if grouped else "gluon-natural"] = (gl, grouped)
    vT = tileattn.prepare_v(v8)
    impls["bf16"] = (lambda: tileattn.attention(qb, kb, vb, causal=causal), None)
    if cudnn_fp8 is not None:
        impls["cudnn-fp8"] = (lambda: cudnn_fp8(q8, k8, v8, causal, **d), None)
    outs = {}
    for r in range(rounds):
        for name, (fn, st) in impls.items():
            if st is not None:
                attention_op.GROUP_V_KEYS = st
                call_cache.clear_all()
            try:
                out = fn(); torch.cuda.synchronize()
                if r == 0 and name != "cudnn-fp8":
                    outs[name] = out.float()
                ms = triton.testing.do_bench(fn, warmup=100, rep=400)
            except Exception as e:
                print(name, D, N, causal, "FAILED", type(e).__name__, str(e)[:300], flush=True)
                continue
            results.setdefault((D, N, causal, name), []).append(flops / ms / 1e9)
    ref = outs.get("bf16")
    errs = {name: float((o - ref).norm() / ref.norm()) for name, o in outs.items() if ref is not None}
    line = {"D": D, "N": N, "causal": causal}
    for name in impls:
        vals = results.get((D, N, causal, name))
        if vals:
            line[name] = round(sorted(vals)[len(vals) // 2], 1)
    line["err_vs_bf16"] = {k_: round(v_, 4) for k_, v_ in errs.items()}
    print(json.dumps(line), flush=True)
    rows.append(line)
    call_cache.clear_all()
    del q, k, v, q8, k8, v8, qb, kb, vb, vT
    torch.cuda.empty_cache()
out = os.environ.get("OUT", ".")
json.dump({"device": torch.cuda.get_device_name(), "date": time.strftime("%Y-%m-%d"), "rows": rows},
          open(os.path.join(out, "fp8-gluon-ab.json"), "w"), indent=1)
