"""A/B: the whole backward (kernels alone) with the portable dK/dV kernel vs the Gluon sm90 one,
B=4 H=32 bf16, D 64/128, N 4096/16384, causal and not; ABAB; gradients compared first."""
import json, math, os, torch, triton
import tileattn
from tileattn.arch import arch_of
from tileattn.kernels.attention import bwd
from tileattn.bench.common import spin_up
dev = torch.device("cuda"); arch = arch_of(dev)
rows = []
spin_up()
def dist(a, b):
    return max(float((x.float() - y.float()).norm() / y.float().norm()) for x, y in zip(a, b))
for D in (64, 128):
    for N in (4096, 16384):
        for causal in (False, True):
            gen = torch.Generator(device=dev).manual_seed(D + N)
            q, k, v, do = (torch.randn(4, N, 32, D, device=dev, generator=gen, dtype=torch.bfloat16) for _ in range(4))
            out, lse = tileattn.attention(q, k, v, causal=causal, return_lse=True)
            opts = dict(causal=causal, softmax_scale=1 / math.sqrt(D), window_left=-1, window_right=-1, arch=arch, deterministic=True)
            grads = {}
            from tileattn.kernels.attention import sm90_bwd
            CANDS = {64: [(128,64,2,8),(64,64,2,4),(64,64,3,4),(128,32,3,8),(64,32,3,4)],
                     128: [(128,64,2,8),(64,64,2,4),(128,32,3,8),(64,32,3,4)]}[D]
            variants = {"triton": ("portable", None)}
            variants.update({str(c): ("sm90", c) for c in CANDS})
            d = {}
            for name, (kern, cfg) in variants.items():
                if cfg: sm90_bwd.CONFIGS[D] = cfg
                g = tuple(torch.full_like(x, float("nan")) for x in (q, k, v))
                bwd.attention_backward(q, k, v, out, lse, do, *g, dkdv_kernel=kern, **opts)
                grads[name] = g
                d[name] = dist(g, grads["triton"])
            flops = 2.5 * 4 * 4 * 32 * N * N * D * (0.5 if causal else 1)
            ms = {name: [] for name in variants}
            for rep in range(2):
                for name, (kern, cfg) in variants.items():
                    if cfg: sm90_bwd.CONFIGS[D] = cfg
                    g = grads[name]
                    f = lambda: bwd.attention_backward(q, k, v, out, lse, do, *g, dkdv_kernel=kern, **opts)
                    ms[name].append(triton.testing.do_bench(f, warmup=30, rep=200, return_mode="median"))
            r = dict(D=D, N=N, causal=causal, distance=d, **{f"{k}_ms": v for k, v in ms.items()},
                     **{f"{k}_tflops": flops / min(v) / 1e9 for k, v in ms.items()})
            rows.append(r)
            print(json.dumps(r), flush=True)
            json.dump(rows, open(os.path.join(os.environ.get("OUT", "."), "bwd-gluon-ab.json"), "w"), indent=1)
