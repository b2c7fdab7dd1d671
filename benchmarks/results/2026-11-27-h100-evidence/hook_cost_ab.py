"""What the document mask hook costs: the same BlockMask lists (document, 16 docs, N=16k) with
the real mask_mod, with cheap hooks (q >= kv; always true), against compiled flex; plus causal."""
import json, os, sys, statistics, torch
sys.path.insert(0, "benchmarks")
import flex_mods
from torch.nn.attention.flex_attention import create_block_mask, BlockMask
from tileattn.bench import flex_peer
from tileattn.bench.common import spin_up, device_facts, time_interleaved
from tileattn.flex import flex_attention
dev = torch.device("cuda"); spin_up()
N = 16384
(q, k, v), _ = flex_mods.make_inputs(N, dev)["bf16"]
doc_mod, _, mb = flex_mods.masks_and_mods("document", N, dev)
doc = create_block_mask(doc_mod, mb, 1, N, N, device=dev)
def with_mod(mod):
    return BlockMask.from_kv_blocks(doc.kv_num_blocks, doc.kv_indices, doc.full_kv_num_blocks,
                                    doc.full_kv_indices, BLOCK_SIZE=doc.BLOCK_SIZE, mask_mod=mod)
causal_hook = with_mod(lambda b, h, qi, kv: qi >= kv)
true_hook = with_mod(lambda b, h, qi, kv: qi >= 0)
causal = create_block_mask(flex_peer.causal, 1, 1, N, N, device=dev)
cflex = flex_peer.compiled_flex_attention()
from tileattn.flex import mask_bits
real_applies = mask_bits.applies
def as_hook():
    mask_bits.applies = lambda *a: False
    try:
        return flex_attention(q, k, v, block_mask=doc)
    finally:
        mask_bits.applies = real_applies
out_bits = flex_attention(q, k, v, block_mask=doc); out_hook = as_hook()
print("bits == hook:", torch.equal(out_bits, out_hook))
calls = {
    "doc": lambda: flex_attention(q, k, v, block_mask=doc),
    "doc_hook": as_hook,
    "doc_lists_causal_hook": lambda: flex_attention(q, k, v, block_mask=causal_hook),
    "doc_lists_true_hook": lambda: flex_attention(q, k, v, block_mask=true_hook),
    "flex_doc": lambda: cflex(q, k, v, block_mask=doc),
    "causal": lambda: flex_attention(q, k, v, block_mask=causal),
}
for c in calls.values(): c()
torch.cuda.synchronize()
t = time_interleaved(calls, rounds=int(os.environ.get("ROUNDS", "5")))
med = {n: statistics.median(x) for n, x in t.items()}
for n in t: print(f"{n:26s} {med[n]:.3f} ms  rounds {[round(x,3) for x in t[n]]}  vs doc {med['doc']/med[n]:.3f}x  vs flex {med['flex_doc']/med[n]:.3f}x")
json.dump(dict(device_facts(), rounds=t, medians=med), open(os.path.join(os.environ.get("OUT", "."), "hook-cost.json"), "w"), indent=1)
