"""Where document masking loses: flex document (bench's random cuts; 16 equal block-aligned
documents) vs the same work as dense causal N=1024 sequences (attention, attention_varlen,
cuDNN), bf16 D=128 H=32, interleaved rounds."""
import itertools, json, os, sys, time
import torch, triton, tileattn
sys.path.insert(0, "benchmarks")
from flex_mods import masks_and_mods
from tileattn.bench import flex_peer
from tileattn.bench.common import spin_up
from torch.nn.attention.flex_attention import create_block_mask, flex_attention
from torch.nn.attention import sdpa_kernel, SDPBackend
torch._dynamo.config.cache_size_limit = 1000
torch._dynamo.config.accumulated_cache_size_limit = 1000
T0 = time.time(); dev = "cuda"; D = 128; N = 16384; H = 32
flex = torch.compile(flex_attention)
fns = {}
torch.manual_seed(0)
q, k, v = (torch.randn(4, H, N, D, device=dev, dtype=torch.bfloat16) for _ in range(3))
mm, _, mb = masks_and_mods("document", N, dev)
bm_rand = create_block_mask(mm, mb, None, N, N, device=dev)
f_rand = flex_peer.mask_flops(mm, mb, H, D, N, N, dev) * (4 // mb)
ids = (torch.arange(N, device=dev) // 1024).to(torch.int32)[None].repeat(4, 1)
mu = flex_peer.document_causal(ids)
bm_uni = create_block_mask(mu, 4, None, N, N, device=dev)
f_uni = flex_peer.mask_flops(mu, 4, H, D, N, N, dev)
fns["doc_random tileattn"] = (f_rand, lambda: tileattn.flex_attention(q, k, v, block_mask=bm_rand))
fns["doc_random flex"] = (f_rand, lambda: flex(q, k, v, block_mask=bm_rand))
fns["doc_uniform tileattn"] = (f_uni, lambda: tileattn.flex_attention(q, k, v, block_mask=bm_uni))
fns["doc_uniform flex"] = (f_uni, lambda: flex(q, k, v, block_mask=bm_uni))
qd, kd, vd = (x.transpose(1, 2).reshape(4, 16, 1024, H, D).reshape(64, 1024, H, D).contiguous() for x in (q, k, v))
fns["dense1k tileattn"] = (f_uni, lambda: tileattn.attention(qd, kd, vd, causal=True))
qs, ks, vs = (x.transpose(1, 2) for x in (qd, kd, vd))
def cudnn():
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        return torch.nn.functional.scaled_dot_product_attention(qs, ks, vs, is_causal=True)
fns["dense1k cudnn"] = (f_uni, cudnn)
qp, kp, vp = (x.reshape(64 * 1024, H, D) for x in (qd, kd, vd))
cu = torch.arange(0, 65 * 1024, 1024, device=dev, dtype=torch.int32)
fns["varlen1k tileattn"] = (f_uni, lambda: tileattn.attention_varlen(qp, kp, vp, cu, cu, 1024, 1024, causal=True, validate=False))
for name, (f, fn) in fns.items():
    fn(); torch.cuda.synchronize()
print(f"[{time.time()-T0:.0f}s] compiled; flops rand {f_rand:.3g} uniform {f_uni:.3g}", flush=True)
spin_up(10)
table = {}
for r in range(int(os.environ.get("ROUNDS", "5"))):
    for name, (f, fn) in fns.items():
        table.setdefault(name, []).append(round(f / triton.testing.do_bench(fn, warmup=25, rep=200) / 1e9, 1))
med = {k2: sorted(v2)[len(v2) // 2] for k2, v2 in table.items()}
for k2, v2 in table.items(): print(k2, v2, "median", med[k2], flush=True)
print("doc_random t/flex", round(med["doc_random tileattn"] / med["doc_random flex"], 3),
      "doc_uniform t/flex", round(med["doc_uniform tileattn"] / med["doc_uniform flex"], 3),
      "dense1k t/cudnn", round(med["dense1k tileattn"] / med["dense1k cudnn"], 3))
json.dump(table, open(os.path.join(os.environ.get("OUT", "."), "doc-diag.json"), "w"), indent=1)
