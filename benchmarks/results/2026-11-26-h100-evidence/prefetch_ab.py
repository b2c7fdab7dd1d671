"""A/B: consumers fetch the next tile id and facts a tile ahead (sm90.AB_TILE_PREFETCH)
interleaved; call caches cleared; outputs compared bit for bit."""
import itertools, json, os, sys, time
import torch, triton, tileattn
from tileattn.kernels.attention import sm90
from tileattn.ops.call_cache import clear_all
sys.path.insert(0, "benchmarks")
from flex_mods import masks_and_mods
from serving import varlen_lengths
from tileattn.bench import flex_peer
from tileattn.bench.common import spin_up
from torch.nn.attention.flex_attention import create_block_mask
T0 = time.time(); dev = "cuda"; H = 32
def use(w):
    sm90.AB_TILE_PREFETCH = bool(w); clear_all()
cases = {}
for n, b, causal, D in ((1024, 64, True, 128), (1024, 64, False, 128), (2048, 32, True, 128), (4096, 8, True, 128)):
    q, k, v = (torch.randn(b, n, H, D, device=dev, dtype=torch.bfloat16) for _ in range(3))
    cases[f"{'causal' if causal else 'full'}{n}-d{D}"] = (4 * b * H * D * n * n / (2 if causal else 1), (lambda q=q, k=k, v=v, c=causal: tileattn.attention(q, k, v, causal=c)))
outs = {}
for w in (0, 1):
    use(w)
    for name, (f, fn) in cases.items():
        o = fn(); torch.cuda.synchronize()
        if w == 0: outs[name] = o.clone()
        elif not torch.equal(o, outs[name]): print("MISMATCH", name, float((o.float() - outs[name].float()).abs().max()), flush=True)
outs.clear()
print(f"[{time.time()-T0:.0f}s] compiled and compared", flush=True)
spin_up(10)
table = {}
for r in range(int(os.environ.get("ROUNDS", "5"))):
    for name, (f, fn) in cases.items():
        for w in (0, 1):
            use(w); fn(); torch.cuda.synchronize()
            table.setdefault(name, {}).setdefault(str(w), []).append(round(f / triton.testing.do_bench(fn, warmup=25, rep=150) / 1e9, 1))
    print(f"[{time.time()-T0:.0f}s] round {r}", flush=True)
for name, row in table.items():
    med = {k2: sorted(v2)[len(v2) // 2] for k2, v2 in row.items()}
    print(f"{name:18s} {row} prefetch/not {med['1'] / med['0']:.3f}", flush=True)
use(0)
json.dump(table, open(os.path.join(os.environ.get("OUT", "."), "tile-prefetch-ab.json"), "w"), indent=1)
