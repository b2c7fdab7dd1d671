"""A/B: fused backward, non-causal programs in WALK_GROUPS staggered groups (G=1 base);
cuDNN same rounds; H=33 (grid a multiple of 132 at 4k) tail check; per-kernel time split."""
import json, math, os, torch, triton
from tileattn.arch import arch_of
from tileattn.kernels.attention import bwd, sm90_bwd_fused as F
from tileattn.bench.common import spin_up, device_facts
import tileattn
from torch.nn.attention import sdpa_kernel, SDPBackend
dev = torch.device("cuda"); arch = arch_of(dev); spin_up()
OUT = os.environ.get("OUT", ".")
GS = [int(x) for x in os.environ.get("GS", "1,2,4,8").split(",")]
ROUNDS = int(os.environ.get("ROUNDS", "3"))

def ref64(q, k, v, do, scale):
    ql, kl, vl = (x.double().requires_grad_() for x in (q, k, v))
    g = q.shape[2] // k.shape[2]
    kk, vv = (x.repeat_interleave(g, dim=2) for x in (kl, vl))
    p = torch.softmax(torch.einsum("bqhd,bkhd->bhqk", ql, kk) * scale, -1)
    o = torch.einsum("bhqk,bkhd->bqhd", p, vv)
    return torch.autograd.grad(o, (ql, kl, vl), do.double())

def opts(D, causal):
    return dict(causal=causal, softmax_scale=1 / math.sqrt(D), window_left=-1, window_right=-1,
                arch=arch, kernel="sm90", deterministic=False)
checks = []
for D in (64, 128):
    for (B, Sq, Sk, Hq, Hkv) in [(2, 1000, 1100, 4, 2), (1, 1100, 900, 4, 4), (1, 2048, 2048, 2, 2)]:
        gen = torch.Generator(device=dev).manual_seed(Sq + D)
        q, k, v, do = (torch.randn(B, s, h, D, device=dev, generator=gen, dtype=torch.bfloat16) for s, h in ((Sq, Hq), (Sk, Hkv), (Sk, Hkv), (Sq, Hq)))
        out, lse = tileattn.attention(q, k, v, return_lse=True)
        want = ref64(q, k, v, do, 1 / math.sqrt(D))
        errs = {}
        for G in GS:
            F.WALK_GROUPS = {D: G}
            g = tuple(torch.full_like(x, float("nan")) for x in (q, k, v))
            bwd.attention_backward(q, k, v, out, lse, do, *g, **opts(D, False))
            torch.cuda.synchronize()
            errs[G] = [float((x.double() - y).norm() / y.norm()) for x, y in zip(g, want)]
        good = all(all(math.isfinite(e) for e in v) and max(v) < 1.3 * max(errs[1]) + 1e-4 for v in errs.values())
        checks.append(dict(D=D, shape=(B, Sq, Sk, Hq, Hkv), errors=errs, ok=good))
        print("check", D, (B, Sq, Sk, Hq, Hkv), errs, "OK" if good else "BAD", flush=True)
F.WALK_GROUPS = {}

def bench_point(D, N, H, causal, variants):
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
    names = [f"G{G}" for G in variants] + ["cudnn"]
    tf = {n: [] for n in names}
    for r in range(ROUNDS):
        for name in (names if r % 2 == 0 else names[::-1]):
            if name == "cudnn":
                ms = triton.testing.do_bench(cudnn_call, warmup=20, rep=300)
            else:
                F.WALK_GROUPS = {D: int(name[1:])}
                ms = triton.testing.do_bench(lambda: bwd.attention_backward(q, k, v, out, lse, do, *g, **opts(D, causal)), warmup=20, rep=300)
            tf[name].append(round(flops / ms / 1e9))
    F.WALK_GROUPS = {}
    # kernel split of the base
    from torch.profiler import profile, ProfilerActivity
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(3):
            bwd.attention_backward(q, k, v, out, lse, do, *g, **opts(D, causal))
        torch.cuda.synchronize()
    split = {}
    for e in prof.key_averages():
        if e.device_type.name == "CUDA" or getattr(e, "device_time_total", 0) > 0:
            split[e.key[:60]] = round(getattr(e, "device_time_total", 0) / 3 / 1000, 4)
    row = dict(D=D, N=N, H=H, causal=causal, tflops=tf, kernel_ms=split)
    print(row, flush=True)
    return row

rows = []
for D, N in ((128, 16384), (64, 16384), (64, 4096), (128, 4096)):
    rows.append(bench_point(D, N, 32, False, GS))
for D in (64, 128):
    rows.append(bench_point(D, 4096, 33, False, [1]))
json.dump(dict(device_facts(), checks=checks, rows=rows), open(os.path.join(OUT, "bwd-walk-ab.json"), "w"), indent=1)
