"""A/B: the fused backward issuing dQ before dK (DQ_FIRST=1) vs after; cuDNN in the same run."""
import json, math, os, torch, triton
import tileattn
from tileattn.arch import arch_of
from tileattn.kernels.attention import bwd
from tileattn.bench.common import spin_up
from torch.nn.attention import sdpa_kernel, SDPBackend
VAR = os.environ.get("VAR", "DEFER_DK"); VALUES = os.environ.get("VALUES", "0,1").split(","); CAUSALS = [c == "1" for c in os.environ.get("CAUSALS", "0,1").split(",")]
DIMS = [int(x) for x in os.environ.get("DIMS", "64,128").split(",")]; NS = [int(x) for x in os.environ.get("NS", "4096,16384").split(",")]; ROUNDS = int(os.environ.get("ROUNDS", "3")); CHECK = os.environ.get("CHECK", "1") == "1"
dev = torch.device("cuda"); arch = arch_of(dev); spin_up()

def ref64(q, k, v, do, causal, scale):
    ql, kl, vl = (x.double().requires_grad_() for x in (q, k, v))
    g = q.shape[2] // k.shape[2]
    kk, vv = (x.repeat_interleave(g, dim=2) for x in (kl, vl))
    s = torch.einsum("bqhd,bkhd->bhqk", ql, kk) * scale
    if causal:
        sq, sk = q.shape[1], k.shape[1]
        m = torch.arange(sk, device=dev)[None, :] <= torch.arange(sq, device=dev)[:, None] + (sk - sq)
        s = s.masked_fill(~m, float("-inf"))
    p = torch.softmax(s, -1).nan_to_num(0.0)
    o = torch.einsum("bhqk,bkhd->bqhd", p, vv)
    return torch.autograd.grad(o, (ql, kl, vl), do.double())
ok = True
for D in ((64, 128) if CHECK else ()):
    for (B, Sq, Sk, Hq, Hkv, causal) in [(2, 1000, 1100, 4, 2, True), (2, 1100, 1000, 4, 4, True), (1, 300, 300, 3, 1, True), (1, 1000, 1000, 2, 2, False), (2, 1000, 1100, 4, 2, False), (1, 300, 333, 3, 1, False)]:
        gen = torch.Generator(device=dev).manual_seed(Sq)
        q, k, v, do = (torch.randn(B, s, h, D, device=dev, generator=gen, dtype=torch.bfloat16) for s, h in ((Sq, Hq), (Sk, Hkv), (Sk, Hkv), (Sq, Hq)))
        out, lse = tileattn.attention(q, k, v, causal=causal, return_lse=True)
        want = ref64(q, k, v, do, causal, 1 / math.sqrt(D))
        errs = {}
        for m in VALUES:
            os.environ[VAR] = m
            g = tuple(torch.full_like(x, float("nan")) for x in (q, k, v))
            bwd.attention_backward(q, k, v, out, lse, do, *g, causal=causal, softmax_scale=1 / math.sqrt(D), window_left=-1, window_right=-1, arch=arch, kernel="sm90", deterministic=False)
            torch.cuda.synchronize()
            errs[m] = [float((x.double() - y).norm() / y.norm()) for x, y in zip(g, want)]
        good = all(all(math.isfinite(x) for x in errs[m]) and max(errs[m]) < 1.5 * max(errs[VALUES[0]]) + 1e-4 for m in VALUES)
        ok &= good
        print("check", D, (B, Sq, Sk, Hq, Hkv, causal), errs, "OK" if good else "BAD", flush=True)
print("CORRECT" if ok else "INCORRECT", flush=True)
rows = []
for D in DIMS:
    for N in NS:
        for causal in CAUSALS:
            gen = torch.Generator(device=dev).manual_seed(N + D)
            q, k, v, do = (torch.randn(4, N, 32, D, device=dev, generator=gen, dtype=torch.bfloat16) for _ in range(4))
            out, lse = tileattn.attention(q, k, v, causal=causal, return_lse=True)
            ql, kl, vl = (x.transpose(1, 2).contiguous().requires_grad_() for x in (q, k, v))
            dol = do.transpose(1, 2).contiguous()
            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                o = torch.nn.functional.scaled_dot_product_attention(ql, kl, vl, is_causal=causal)
            cudnn_call = lambda: torch.autograd.grad(o, (ql, kl, vl), dol, retain_graph=True)
            opts = dict(causal=causal, softmax_scale=1 / math.sqrt(D), window_left=-1, window_right=-1, arch=arch, kernel="sm90", deterministic=False)
            grads = {}
            for m in VALUES:
                os.environ[VAR] = m
                g = tuple(torch.full_like(x, float("nan")) for x in (q, k, v))
                bwd.attention_backward(q, k, v, out, lse, do, *g, **opts); torch.cuda.synchronize()
                grads[m] = g
            diff = {m: [float((a.float() - b.float()).norm() / b.float().norm()) for a, b in zip(grads[m], grads[VALUES[0]])] for m in VALUES[1:]}
            ms = {**{f"{VAR}={m}": [] for m in VALUES}, "cudnn": []}
            for rep in range(ROUNDS):
                for m in VALUES:
                    name = f"{VAR}={m}"
                    os.environ[VAR] = m
                    g = grads[m]
                    ms[name].append(triton.testing.do_bench(lambda: bwd.attention_backward(q, k, v, out, lse, do, *g, **opts), warmup=20, rep=150, return_mode="median"))
                ms["cudnn"].append(triton.testing.do_bench(cudnn_call, warmup=20, rep=150, return_mode="median"))
            flops = 2.5 * 4 * 4 * 32 * N * N * D * (0.5 if causal else 1)
            tf = {n: flops / min(v) / 1e9 for n, v in ms.items()}
            rows.append(dict(D=D, N=N, causal=causal, ms=ms, tflops=tf, diff_vs_first=diff))
            print(D, N, causal, {n: round(t) for n, t in tf.items()}, {n: round(t / tf["cudnn"], 3) for n, t in tf.items()}, {m: [f"{x:.1e}" for x in d] for m, d in diff.items()}, flush=True)
            del ql, kl, vl, o, grads
            torch.cuda.empty_cache()
json.dump(dict(device=torch.cuda.get_device_name(), rows=rows), open(os.path.join(os.environ.get("OUT", "."), f"bwd-{VAR.lower()}-ab.json"), "w"), indent=1)
