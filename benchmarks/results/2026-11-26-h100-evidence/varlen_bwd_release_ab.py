"""A/B: packed causal backward at D=128 (the serving mix, GQA 32/8), the fused kernel with
per-thread release (PER_THREAD_RELEASE as landed) vs without (empty set)."""
import json, math, os, torch, triton
import tileattn
from tileattn.arch import arch_of
from tileattn.kernels.attention import bwd, sm90_bwd_fused
from tileattn.bench.common import spin_up
dev = torch.device("cuda"); arch = arch_of(dev); spin_up()
lengths = [4289, 2994, 736, 376, 1073, 690, 3333, 452, 929, 1448, 5590, 1044, 413, 2967, 1675, 363, 5628, 7626, 3721, 5454, 465, 2663, 5379, 2201, 912, 195, 779, 1624, 5705, 7130, 931, 4679]
landed = set(sm90_bwd_fused.PER_THREAD_RELEASE)
variants = {"per_thread": landed, "one_thread": set()}
rows = []
D = 128
total = sum(lengths)
cu = torch.tensor([0] + lengths, device=dev).cumsum(0).to(torch.int32)
q = torch.randn(total, 32, D, device=dev, dtype=torch.bfloat16)
k, v = (torch.randn(total, 8, D, device=dev, dtype=torch.bfloat16) for _ in range(2))
do = torch.randn_like(q)
out, lse = tileattn.attention_varlen(q, k, v, cu, cu, max(lengths), max(lengths), causal=True, return_lse=True)
opts = dict(causal=True, softmax_scale=1 / math.sqrt(D), window_left=-1, window_right=-1, arch=arch, kernel="sm90",
            cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=max(lengths), max_seqlen_k=max(lengths), deterministic=False)
grads = {}
for name, s in variants.items():
    sm90_bwd_fused.PER_THREAD_RELEASE = s
    g = tuple(torch.full_like(x, float("nan")) for x in (q, k, v))
    bwd.attention_backward(q, k, v, out, lse, do, *g, **opts); torch.cuda.synchronize()
    grads[name] = g
diff = [float((a.float() - b.float()).norm() / b.float().norm()) for a, b in zip(grads["per_thread"], grads["one_thread"])]
ms = {n: [] for n in variants}
for rep in range(5):
    for name, s in variants.items():
        sm90_bwd_fused.PER_THREAD_RELEASE = s
        g = grads[name]
        ms[name].append(triton.testing.do_bench(lambda: bwd.attention_backward(q, k, v, out, lse, do, *g, **opts), warmup=10, rep=100, return_mode="median"))
sm90_bwd_fused.PER_THREAD_RELEASE = landed
flops = 2.5 * 4 * 32 * D * sum(n * (n + 1) / 2 for n in lengths)
tf = {n: flops / min(v) / 1e9 for n, v in ms.items()}
print("varlen D=128", {n: round(t) for n, t in tf.items()}, round(tf["per_thread"] / tf["one_thread"], 3), [f"{x:.1e}" for x in diff], flush=True)
json.dump(dict(device=torch.cuda.get_device_name(), lengths=lengths, D=D, ms=ms, tflops=tf, diff=diff), open(os.path.join(os.environ.get("OUT", "."), "varlen-bwd-release-ab.json"), "w"), indent=1)
