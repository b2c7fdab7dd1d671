"""A/B: varlen work lists ordered by kv head within a (band, sequence) (landed) vs one pair's
heads together (num_kv_heads=1 passed down: the earlier order); the serving mix, GQA 32/8,
causal, D=128, bf16; the fixed-length point of serving.py in the same run."""
import itertools, json, os, sys, torch, triton, tileattn
sys.path.insert(0, "benchmarks")
from serving import varlen_lengths
from tileattn.kernels.attention import sm90
from tileattn.bench.common import spin_up
landed = sm90.varlen_work_lists
def pair_order(cu_q, cu_k, num_heads, num_kv_heads, *rest):
    return landed(cu_q, cu_k, num_heads, 1, *rest)
VARIANTS = {"kv_order": landed, "pair_order": pair_order}
D = 128; dev = "cuda"
torch.manual_seed(0)
lengths = varlen_lengths(); total = sum(lengths)
q = torch.randn(total, 32, D, device=dev, dtype=torch.bfloat16)
k = torch.randn(total, 8, D, device=dev, dtype=torch.bfloat16); v = torch.randn_like(k)
cu = torch.tensor([0] + list(itertools.accumulate(lengths)), device=dev, dtype=torch.int32)
fv = lambda: tileattn.attention_varlen(q, k, v, cu, cu, max(lengths), max(lengths), causal=True)
flops = sum(4 * D * 32 * n * (n + 1) / 2 for n in lengths)
# fixed length at the same total work (serving.py's "fixed" point: B=4, N=... causal)
spin_up()
outs = {}
for name, f in VARIANTS.items():
    sm90.varlen_work_lists = f
    outs[name] = fv().float()
diff = float((outs["kv_order"] - outs["pair_order"]).abs().max())
table = {n: [] for n in VARIANTS}
for r in range(9):
    for name, f in VARIANTS.items():
        sm90.varlen_work_lists = f
        t = triton.testing.do_bench(fv, warmup=25, rep=200)
        table[name].append(flops / t / 1e9)
sm90.varlen_work_lists = landed
med = {n: sorted(v)[len(v) // 2] for n, v in table.items()}
print("max diff", diff, "medians", {n: round(x, 1) for n, x in med.items()}, "ratio", round(med["kv_order"] / med["pair_order"], 4), flush=True)
json.dump(dict(device=torch.cuda.get_device_name(), lengths=lengths, tflops=table, medians=med, max_diff=diff), open(os.path.join(os.environ.get("OUT", "."), "varlen-kv-order-ab.json"), "w"), indent=1)
