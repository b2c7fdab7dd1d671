"""Mask bits vs the hook on short document-masked calls (B=4 H=32 D=128, 4 causal documents):
GPU time (do_bench, its L2 flush hides host time) and back-to-back wall time a call (host
included), 5 interleaved rounds."""
import json, os, statistics, time, sys
import torch, triton
sys.path.insert(0, "benchmarks")
from torch.nn.attention.flex_attention import create_block_mask
from tileattn.bench import flex_peer
from tileattn.bench.common import spin_up, device_facts
from tileattn.flex import flex_attention, mask_bits
real = mask_bits.applies
spin_up()
rows = []
for n in (1024, 4096):
    gen = torch.Generator().manual_seed(n)
    cuts = torch.stack([torch.randperm(n - 1, generator=gen)[:3].sort().values + 1 for _ in range(4)])
    doc = torch.stack([torch.searchsorted(c, torch.arange(n), right=True) for c in cuts]).to(torch.int32).cuda()
    mask_mod = flex_peer.document_causal(doc)
    bm = create_block_mask(mask_mod, 4, 1, n, n, device="cuda")
    q, k, v = (torch.randn(4, 32, n, 128, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    def run(bits):
        mask_bits.applies = real if bits else (lambda *a: False)
        return flex_attention(q, k, v, block_mask=bm)
    same = torch.equal(run(True), run(False))
    t = {"bits": [], "hook": []}; w = {"bits": [], "hook": []}
    for r in range(5):
        for name in (("bits", "hook") if r % 2 == 0 else ("hook", "bits")):
            on = name == "bits"
            run(on)
            t[name].append(triton.testing.do_bench(lambda: run(on), warmup=25, rep=200, return_mode="median"))
            torch.cuda.synchronize(); start = time.perf_counter()
            for _ in range(50): run(on)
            torch.cuda.synchronize(); w[name].append((time.perf_counter() - start) / 50 * 1e3)
    row = dict(N=n, bit_equal=same, **{f"{k}_ms": statistics.median(x) for k, x in t.items()},
               **{f"{k}_wall_ms": statistics.median(x) for k, x in w.items()}, rounds=t, wall_rounds=w)
    print(f"N={n} bit-equal {same}: do_bench bits {row['bits_ms']*1e3:.0f} us hook {row['hook_ms']*1e3:.0f} us ({row['hook_ms']/row['bits_ms']:.3f}x); back-to-back bits {row['bits_wall_ms']*1e3:.0f} us hook {row['hook_wall_ms']*1e3:.0f} us ({row['hook_wall_ms']/row['bits_wall_ms']:.3f}x)", flush=True)
    rows.append(row)
mask_bits.applies = real
json.dump(dict(device_facts(), rows=rows), open(os.path.join(os.environ.get("OUT", "."), "bits-small-ab.json"), "w"), indent=1)
