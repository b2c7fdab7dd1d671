"""A/B: the fused backward's programs starting their query walk at rotated steps (non-causal;
sm90_bwd_fused.ROTATE_STEPS) vs all at step 0 (every program reducing into the same dQ rows at
once); cuDNN in the same rounds. Correctness of both against fp64 first."""
import json, math, os, time, torch, triton
from tileattn.arch import arch_of
from tileattn.kernels.attention import bwd, sm90_bwd_fused
from tileattn.bench.common import spin_up, device_facts
import tileattn
from torch.nn.attention import sdpa_kernel, SDPBackend
dev = torch.device("cuda"); arch = arch_of(dev); spin_up()
OUT = os.environ.get("OUT", ".")

def ref64(q, k, v, do, scale):
    ql, kl, vl = (x.double().requires_grad_() for x in (q, k, v))
    g = q.shape[2] // k.shape[2]
    kk, vv = (x.repeat_interleave(g, dim=2) for x in (kl, vl))
    p = torch.softmax(torch.einsum("bqhd,bkhd->bhqk", ql, kk) * scale, -1)
    o = torch.einsum("bhqk,bkhd->bqhd", p, vv)
    return torch.autograd.grad(o, (ql, kl, vl), do.double())
checks = []
for D in (64, 128):
    for (B, Sq, Sk, Hq, Hkv) in [(2, 1000, 1100, 4, 2), (1, 1100, 900, 4, 4), (1, 300, 300, 3, 1), (1, 2048, 2048, 2, 2)]:
        gen = torch.Generator(device=dev).manual_seed(Sq + D)
        q, k, v, do = (torch.randn(B, s, h, D, device=dev, generator=gen, dtype=torch.bfloat16) for s, h in ((Sq, Hq), (Sk, Hkv), (Sk, Hkv), (Sq, Hq)))
        out, lse = tileattn.attention(q, k, v, return_lse=True)
        want = ref64(q, k, v, do, 1 / math.sqrt(D))
        errs = {}
        for rot in (False, True):
            sm90_bwd_fused.ROTATE_STEPS = rot
            g = tuple(torch.full_like(x, float("nan")) for x in (q, k, v))
            bwd.attention_backward(q, k, v, out, lse, do, *g, causal=False, softmax_scale=1 / math.sqrt(D), window_left=-1, window_right=-1, arch=arch, kernel="sm90", deterministic=False)
            torch.cuda.synchronize()
            errs[rot] = [float((x.double() - y).norm() / y.norm()) for x, y in zip(g, want)]
        good = all(math.isfinite(x) for x in errs[True]) and max(errs[True]) < 1.3 * max(errs[False]) + 1e-4
        checks.append(dict(D=D, shape=(B, Sq, Sk, Hq, Hkv), errors_base=errs[False], errors_rotated=errs[True], ok=good))
        print("check", D, (B, Sq, Sk, Hq, Hkv), errs, "OK" if good else "BAD", flush=True)
rows = []
ROUNDS = int(os.environ.get("ROUNDS", "3"))
for D, N, causal in ((128, 16384, False), (64, 16384, False), (128, 4096, False), (64, 4096, False), (128, 16384, True)):
    gen = torch.Generator(device=dev).manual_seed(N + D)
    q, k, v, do = (torch.randn(4, N, 32, D, device=dev, generator=gen, dtype=torch.bfloat16) for _ in range(4))
    out, lse = tileattn.attention(q, k, v, causal=causal, return_lse=True)
    ql, kl, vl = (x.transpose(1, 2).contiguous().requires_grad_() for x in (q, k, v))
    dol = do.transpose(1, 2).contiguous()
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        o = torch.nn.functional.scaled_dot_product_attention(ql, kl, vl, is_causal=causal)
    cudnn_call = lambda: torch.autograd.grad(o, (ql, kl, vl), dol, retain_graph=True)
    opts = dict(causal=causal, softmax_scale=1 / math.sqrt(D), window_left=-1, window_right=-1, arch=arch, kernel="sm90", deterministic=False)
    g = tuple(torch.empty_like(x) for x in (q, k, v))
    tf = {"base": [], "rotated": [], "cudnn": []}
    flops = 2.5 * 4 * 4 * 32 * N * N * D * (0.5 if causal else 1)
    names = list(tf)
    for r in range(ROUNDS):
        for name in (names if r % 2 == 0 else names[::-1]):
            if name == "cudnn":
                ms = triton.testing.do_bench(cudnn_call, warmup=20, rep=300)
            else:
                sm90_bwd_fused.ROTATE_STEPS = name == "rotated"
                ms = triton.testing.do_bench(lambda: bwd.attention_backward(q, k, v, out, lse, do, *g, **opts), warmup=20, rep=300)
            tf[name].append(round(flops / ms / 1e9))
    row = dict(D=D, N=N, causal=causal, **tf)
    rows.append(row); print(row, flush=True)
sm90_bwd_fused.ROTATE_STEPS = True
json.dump(dict(device_facts(), checks=checks, rows=rows), open(os.path.join(OUT, "bwd-rotate-ab.json"), "w"), indent=1)
