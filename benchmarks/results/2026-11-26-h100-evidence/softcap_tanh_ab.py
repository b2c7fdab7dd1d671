"""A/B: softcap's tanh in the Hopper forward (variants of sm90.TANH_VARIANT), same run."""
import json, time, torch, triton
import tileattn
from tileattn.kernels.attention import sm90
from tileattn.reference import attention_reference

torch.manual_seed(0)
dev = "cuda"
B, N, H, D, CAP = 4, 16384, 32, 128, 30.0
flops = 4 * B * H * N * N * D / 2
q, k, v = (torch.randn(B, N, H, D, device=dev, dtype=torch.bfloat16) for _ in range(3))
VARIANTS = [1, 2, 6, 10]
res = {}
def bench(variant):
    if variant == "none":
        fn = lambda: tileattn.attention(q, k, v, causal=True)
    else:
        sm90.TANH_VARIANT = variant
        fn = lambda: tileattn.attention(q, k, v, causal=True, softcap=CAP)
    fn(); torch.cuda.synchronize()
    return triton.testing.do_bench(fn, warmup=50, rep=300)
for rnd in range(3):
    for var in VARIANTS + ["none"]:
        ms = bench(var)
        res.setdefault(str(var), []).append(flops / ms / 1e9)
for kk, vv in res.items():
    print("variant", kk, "tflops", [round(x) for x in vv], "median", round(sorted(vv)[1]))
base = sorted(res["none"])[1]
for var in VARIANTS:
    print("variant", var, "ratio to no-softcap", round(sorted(res[str(var)])[1] / base, 3))

# accuracy vs fp64, forward and backward, two input scales (x3: scores near saturation)
for scale in (1.0, 3.0):
    torch.manual_seed(1)
    Bs, Ns, Hs = 2, 3071, 16
    qs, ks, vs = (torch.randn(Bs, Ns, Hs, D, device=dev) * scale for _ in range(3))
    qs, ks, vs = (x.to(torch.bfloat16) for x in (qs, ks, vs))
    q64, k64, v64 = (x.double().requires_grad_() for x in (qs, ks, vs))
    ref, _ = attention_reference(q64, k64, v64, causal=True, softcap=CAP)
    do = torch.randn_like(ref)
    ref.backward(do)
    for var in VARIANTS:
        sm90.TANH_VARIANT = var
        qg, kg, vg = (x.clone().requires_grad_() for x in (qs, ks, vs))
        out = tileattn.attention(qg, kg, vg, causal=True, softcap=CAP)
        out.backward(do.to(out.dtype))
        rel = lambda a, b: ((a.double() - b).norm() / b.norm()).item()
        print(f"scale {scale} variant {var}: out {rel(out, ref):.2e} dq {rel(qg.grad, q64.grad):.2e} "
              f"dk {rel(kg.grad, k64.grad):.2e} dv {rel(vg.grad, v64.grad):.2e}")
