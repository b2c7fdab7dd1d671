"""A/B at D=256: whole backward (kernels alone), portable vs Gluon dQ rows (dK/dV portable) ; B=4 H=32 bf16, N 4k/16k, causal and not; ABAB; gradients
compared with the portable ones first (poisoned outputs)."""
import json, math, os, torch, triton
import tileattn
from tileattn.arch import arch_of
from tileattn.kernels.attention import bwd, sm90_bwd
from tileattn.bench.common import spin_up
dev = torch.device("cuda"); arch = arch_of(dev)
rows = []
spin_up()
def dist(a, b):
    return max(float((x.float() - y.float()).norm() / y.float().norm()) for x, y in zip(a, b))
D = 256
variants = {"portable": ("portable", None, None)}
for dq in [(64, 64, 2, 4), (64, 32, 2, 4), (64, 32, 3, 4), (128, 32, 2, 8)]:
    variants[f"dq{dq}"] = ("sm90", None, dq)
def configure(dkdv, dq):
    sm90_bwd.DKDV_CONFIGS.pop(256, None); sm90_bwd.DQ_CONFIGS.pop(256, None)
    if dkdv: sm90_bwd.DKDV_CONFIGS[256] = dkdv
    if dq: sm90_bwd.DQ_CONFIGS[256] = dq
for N in (4096, 16384):
    for causal in (False, True):
        gen = torch.Generator(device=dev).manual_seed(N)
        q, k, v, do = (torch.randn(4, N, 32, D, device=dev, generator=gen, dtype=torch.bfloat16) for _ in range(4))
        out, lse = tileattn.attention(q, k, v, causal=causal, return_lse=True)
        opts = dict(causal=causal, softmax_scale=1 / math.sqrt(D), window_left=-1, window_right=-1, arch=arch, deterministic=True)
        grads, d = {}, {}
        for name, (kern, dkdv, dq) in variants.items():
            configure(dkdv, dq)
            g = tuple(torch.full_like(x, float("nan")) for x in (q, k, v))
            bwd.attention_backward(q, k, v, out, lse, do, *g, kernel=kern, **opts)
            grads[name] = g
            d[name] = dist(g, grads["portable"])
        flops = 2.5 * 4 * 4 * 32 * N * N * D * (0.5 if causal else 1)
        ms = {name: [] for name in variants}
        for rep in range(2):
            for name, (kern, dkdv, dq) in variants.items():
                configure(dkdv, dq)
                g = grads[name]
                f = lambda: bwd.attention_backward(q, k, v, out, lse, do, *g, kernel=kern, **opts)
                ms[name].append(triton.testing.do_bench(f, warmup=30, rep=200, return_mode="median"))
        r = dict(D=D, N=N, causal=causal, distance=d, ms=ms,
                 tflops={name: flops / min(v) / 1e9 for name, v in ms.items()})
        rows.append(r)
        print(N, causal, {n: round(t) for n, t in r["tflops"].items()}, {n: f"{x:.1e}" for n, x in d.items()}, flush=True)
        json.dump(rows, open(os.path.join(os.environ.get("OUT", "."), "bwd-d256-ab.json"), "w"), indent=1)
