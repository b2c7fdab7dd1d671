"""Kernel-level A/B at short sequences: fused (deterministic=False) vs split (True) backward,
cuDNN in the same run; B=4, H=32, bf16."""
import json, math, os, torch, triton
import tileattn
from tileattn.arch import arch_of
from tileattn.kernels.attention import bwd
from tileattn.bench.common import spin_up
from torch.nn.attention import sdpa_kernel, SDPBackend
dev = torch.device("cuda"); arch = arch_of(dev); spin_up()
rows = []
for D in (64, 128):
    for N in (1024, 2048):
        for causal in (False, True):
            gen = torch.Generator(device=dev).manual_seed(N + D)
            q, k, v, do = (torch.randn(4, N, 32, D, device=dev, generator=gen, dtype=torch.bfloat16) for _ in range(4))
            out, lse = tileattn.attention(q, k, v, causal=causal, return_lse=True)
            ql, kl, vl = (x.transpose(1, 2).contiguous().requires_grad_() for x in (q, k, v))
            dol = do.transpose(1, 2).contiguous()
            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                o = torch.nn.functional.scaled_dot_product_attention(ql, kl, vl, is_causal=causal)
            cudnn_call = lambda: torch.autograd.grad(o, (ql, kl, vl), dol, retain_graph=True)
            opts = dict(causal=causal, softmax_scale=1 / math.sqrt(D), window_left=-1, window_right=-1, arch=arch, kernel="sm90")
            grads = {}
            for name, det in (("fused", False), ("split", True)):
                g = tuple(torch.full_like(x, float("nan")) for x in (q, k, v))
                bwd.attention_backward(q, k, v, out, lse, do, *g, deterministic=det, **opts); torch.cuda.synchronize()
                grads[name] = g
            ms = {"fused": [], "split": [], "cudnn": []}
            for rep in range(5):
                for name, det in (("fused", False), ("split", True)):
                    g = grads[name]
                    ms[name].append(triton.testing.do_bench(lambda: bwd.attention_backward(q, k, v, out, lse, do, *g, deterministic=det, **opts), warmup=20, rep=100, return_mode="median"))
                ms["cudnn"].append(triton.testing.do_bench(cudnn_call, warmup=20, rep=100, return_mode="median"))
            flops = 2.5 * 4 * 4 * 32 * N * N * D * (0.5 if causal else 1)
            tf = {n: flops / min(v) / 1e9 for n, v in ms.items()}
            rows.append(dict(D=D, N=N, causal=causal, ms=ms, tflops=tf))
            print(D, N, causal, {n: round(t) for n, t in tf.items()}, {n: round(t / tf["cudnn"], 3) for n, t in tf.items()}, flush=True)
json.dump(dict(device=torch.cuda.get_device_name(), rows=rows), open(os.path.join(os.environ.get("OUT", "."), "bwd-small-ab.json"), "w"), indent=1)
