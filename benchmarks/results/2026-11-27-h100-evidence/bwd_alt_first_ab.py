"""A/B: fused backward, non-causal dQ computed whole by the warpgroups in turns
(sm90_bwd_fused.ALTERNATE_DQ) vs each warpgroup's half every step; cuDNN same rounds."""
import json, math, os, torch, triton
from tileattn.arch import arch_of
from tileattn.kernels.attention import bwd, sm90_bwd_fused as F
from tileattn.bench.common import spin_up, device_facts
import tileattn
from torch.nn.attention import sdpa_kernel, SDPBackend
dev = torch.device("cuda"); arch = arch_of(dev); spin_up()
OUT = os.environ.get("OUT", ".")
ROUNDS = int(os.environ.get("ROUNDS", "3"))

def ref64(q, k, v, do, scale, causal):
    ql, kl, vl = (x.double().requires_grad_() for x in (q, k, v))
    g = q.shape[2] // k.shape[2]
    kk, vv = (x.repeat_interleave(g, dim=2) for x in (kl, vl))
    s = torch.einsum("bqhd,bkhd->bhqk", ql, kk) * scale
    if causal:
        i = torch.arange(q.shape[1], device=q.device)[:, None]; j = torch.arange(k.shape[1], device=q.device)[None]
        s = s.masked_fill(j > i + k.shape[1] - q.shape[1], float("-inf"))
    o = torch.einsum("bhqk,bkhd->bqhd", torch.softmax(s, -1), vv)
    return torch.autograd.grad(o, (ql, kl, vl), do.double())

def opts(D, causal):
    return dict(causal=causal, softmax_scale=1 / math.sqrt(D), window_left=-1, window_right=-1,
                arch=arch, kernel="sm90", deterministic=False)

VARIANTS = {"off": (set(), set()), "base": ({(64, False)}, set()),
            "first": ({(64, False)}, {(64, False)}),
            "first128": ({(64, False), (128, False)}, {(128, False)})}
def set_variant(name, D):
    F.ALTERNATE_DQ, F.ALTERNATE_DQ_FIRST = VARIANTS[name]

checks = []
for D in (64, 128):
    for (B, Sq, Sk, Hq, Hkv, causal) in [(2, 1000, 1100, 4, 2, False), (1, 1100, 900, 4, 4, False), (3, 700, 2048, 6, 2, False), (2, 1000, 1100, 4, 2, True)]:
        gen = torch.Generator(device=dev).manual_seed(Sq + D)
        q, k, v, do = (torch.randn(B, s, h, D, device=dev, generator=gen, dtype=torch.bfloat16) for s, h in ((Sq, Hq), (Sk, Hkv), (Sk, Hkv), (Sq, Hq)))
        out, lse = tileattn.attention(q, k, v, causal=causal, return_lse=True)
        want = ref64(q, k, v, do, 1 / math.sqrt(D), causal)
        errs = {}
        for name in ("off", "first", "first128"):
            set_variant(name, D)
            g = tuple(torch.full_like(x, float("nan")) for x in (q, k, v))
            bwd.attention_backward(q, k, v, out, lse, do, *g, **opts(D, causal))
            torch.cuda.synchronize()
            errs[name] = dict(err=[float((x.double() - y).norm() / y.norm()) for x, y in zip(g, want)])
        base = max(errs["off"]["err"])
        good = all(all(math.isfinite(e) for e in v["err"]) and max(v["err"]) < 1.3 * base + 1e-4 for v in errs.values())
        checks.append(dict(D=D, shape=(B, Sq, Sk, Hq, Hkv), causal=causal, variants=errs, ok=good))
        print("check", D, (B, Sq, Sk, Hq, Hkv, causal), errs, "OK" if good else "BAD", flush=True)
set_variant("base", 0)

def bench_point(D, N, causal, variants, H=32):
    gen = torch.Generator(device=dev).manual_seed(N + D)
    q, k, v, do = (torch.randn(4, N, H, D, device=dev, generator=gen, dtype=torch.bfloat16) for _ in range(4))
    out, lse = tileattn.attention(q, k, v, causal=causal, return_lse=True)
    ql, kl, vl = (x.transpose(1, 2).contiguous().requires_grad_() for x in (q, k, v))
    dol = do.transpose(1, 2).contiguous()
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        o = torch.nn.functional.scaled_dot_product_attention(ql, kl, vl, is_causal=causal)
    cudnn_call = lambda: torch.autograd.grad(o, (ql, kl, vl), dol, retain_graph=True)
    g = tuple(torch.empty_like(x) for x in (q, k, v))
    flops = 2.5 * 4 * 4 * H * N * N * D * (0.5 if causal else 1)
    names = list(variants) + ["cudnn"]
    tf = {n: [] for n in names}
    for r in range(ROUNDS):
        for name in (names if r % 2 == 0 else names[::-1]):
            if name == "cudnn":
                ms = triton.testing.do_bench(cudnn_call, warmup=20, rep=300)
            else:
                set_variant(name, D)
                ms = triton.testing.do_bench(lambda: bwd.attention_backward(q, k, v, out, lse, do, *g, **opts(D, causal)), warmup=20, rep=300)
            tf[name].append(round(flops / ms / 1e9))
    set_variant("base", D)
    row = dict(D=D, N=N, H=H, causal=causal, tflops=tf)
    print(row, flush=True)
    return row

rows = []
POINTS = [(64, 16384, False), (64, 4096, False), (128, 16384, False), (128, 4096, False)]
for D, N, causal in POINTS:
    variants = ["base", "first"] if D == 64 else ["base", "first128"]
    rows.append(bench_point(D, N, causal, variants))
json.dump(dict(device_facts(), checks=checks, rows=rows), open(os.path.join(OUT, "bwd-alt-first-ab.json"), "w"), indent=1)
