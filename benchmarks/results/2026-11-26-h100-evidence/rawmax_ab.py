"""A/B: softcap's block row max from the raw scores (sm90.AB_SOFTCAP_RAW_MAX 0/1), causal B4
H32 N16k D128 bf16, no-softcap in the same run; the call cache is cleared at every switch (a
replay would run the first variant's kernel); errors vs fp64 on a small case."""
import json, math, os, time
import torch, triton, tileattn
from tileattn.kernels.attention import sm90
from tileattn.ops import attention as attention_op
T0 = time.time()
dev = "cuda"
rounds = int(os.environ.get("ROUNDS", "7"))
B, H, N, D = 4, 32, 16384, 128
torch.manual_seed(0)
q, k, v = (torch.randn(B, N, H, D, device=dev, dtype=torch.bfloat16) for _ in range(3))
flops = 4 * B * H * D * N * N / 2
qs, ks, vs = (torch.randn(2, 1000, 8, 128, device=dev, dtype=torch.bfloat16) * 3 for _ in range(3))
def fp64_ref(cap):
    qd, kd, vd = (x.double().transpose(1, 2) for x in (qs, ks, vs))
    s = qd @ kd.transpose(-1, -2) / math.sqrt(128)
    s = cap * torch.tanh(s / cap)
    mask = torch.ones(1000, 1000, dtype=torch.bool, device=dev).tril()
    return (s.masked_fill(~mask, float("-inf")).softmax(-1) @ vd).transpose(1, 2)
ref = fp64_ref(30.0)
def use(variant):
    sm90.AB_SOFTCAP_RAW_MAX = variant
    attention_op._CALLS.clear()
for variant in (0, 1):
    use(variant)
    out = tileattn.attention(qs, ks, vs, causal=True, softcap=30.0).double()
    big = tileattn.attention(q, k, v, causal=True, softcap=30.0).float()
    print(f"[{time.time()-T0:.0f}s] raw_max {variant}: rel err {float((out - ref).norm() / ref.norm()):.4e} finite {bool(torch.isfinite(big).all())}", flush=True)
table = {}
for r in range(rounds):
    for variant in ("0", "1", "nosoftcap"):
        use(0 if variant == "nosoftcap" else int(variant))
        cap = 0.0 if variant == "nosoftcap" else 30.0
        fn = lambda: tileattn.attention(q, k, v, causal=True, softcap=cap)
        ms = triton.testing.do_bench(fn, warmup=25, rep=200)
        table.setdefault(variant, []).append(round(flops / ms / 1e9, 1))
    print(f"[{time.time()-T0:.0f}s] round {r}: {table}", flush=True)
med = {k2: sorted(v2)[len(v2) // 2] for k2, v2 in table.items()}
print("medians", med, {k2: round(v2 / med["nosoftcap"], 3) for k2, v2 in med.items()}, "raw/current", round(med["1"] / med["0"], 3))
json.dump(table, open(os.path.join(os.environ.get("OUT", "."), "rawmax_ab.json"), "w"), indent=1)
