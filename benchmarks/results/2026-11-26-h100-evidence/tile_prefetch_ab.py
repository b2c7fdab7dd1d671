"""A/B of a per-tile change in the Hopper forward, one process: sm90.AB_PREFETCH False/True
interleaved per case; prints as it goes."""
import itertools, json, os, sys, time
import torch, triton, tileattn
from tileattn.kernels.attention import sm90
sys.path.insert(0, "benchmarks")
from serving import varlen_lengths
from flex_mods import masks_and_mods
from tileattn.bench import flex_peer
from torch.nn.attention.flex_attention import create_block_mask

T0 = time.time()
dev = "cuda"; D = 128
cases = sys.argv[1].split(",")
variants = [False, True]
rounds = int(os.environ.get("ROUNDS", "3"))
table = {}
for case in cases:
    torch.manual_seed(0)
    if case == "varlen":
        lengths = varlen_lengths()
        total = sum(lengths)
        q = torch.randn(total, 32, D, device=dev, dtype=torch.bfloat16)
        k = torch.randn(total, 8, D, device=dev, dtype=torch.bfloat16); v = torch.randn_like(k)
        cu = torch.tensor([0] + list(itertools.accumulate(lengths)), device=dev, dtype=torch.int32)
        fn = lambda: tileattn.attention_varlen(q, k, v, cu, cu, max(lengths), max(lengths), causal=True, validate=False)
        flops = sum(4 * D * 32 * n * (n + 1) / 2 for n in lengths)
    elif case.startswith("dense"):
        n = 1024 if "1k" in case else 16384
        b = 16 if n == 1024 else 4
        causal = "causal" in case
        q, k, v = (torch.randn(b, n, 32, D, device=dev, dtype=torch.bfloat16) for _ in range(3))
        fn = lambda: tileattn.attention(q, k, v, causal=causal)
        flops = b * 4 * D * 32 * n * n / (2 if causal else 1)
    else:
        n = 16384
        mask_mod, score_mod, mask_batch = masks_and_mods(case, n, dev)
        bm = create_block_mask(mask_mod, mask_batch, None, n, n, device=dev)
        q, k, v = (torch.randn(4, 32, n, D, device=dev, dtype=torch.bfloat16) for _ in range(3))
        fn = lambda: tileattn.flex_attention(q, k, v, block_mask=bm, score_mod=score_mod)
        flops = flex_peer.mask_flops(mask_mod, mask_batch, 32, D, n, n, dev) * (4 // mask_batch)
    outs = []
    for variant in variants:
        sm90.AB_PREFETCH = variant
        outs.append(fn().float()); torch.cuda.synchronize()
    print(f"[{time.time() - T0:.0f}s] {case}: compiled; max diff {float((outs[0] - outs[1]).abs().max()):.3g}", flush=True)
    for r in range(rounds):
        for variant in variants:
            sm90.AB_PREFETCH = variant
            ms = triton.testing.do_bench(fn, warmup=25, rep=150)
            table.setdefault(case, {}).setdefault(str(variant), []).append(round(flops / ms / 1e9, 1))
    row = table[case]
    med = {k2: sorted(v2)[len(v2) // 2] for k2, v2 in row.items()}
    print(f"[{time.time() - T0:.0f}s] {case}: {row} ratio {med['True'] / med['False']:.3f}", flush=True)
    del q, k, v, fn
    torch.cuda.empty_cache()
json.dump(table, open(os.path.join(os.environ.get("OUT", "."), "tile_ab.json"), "w"), indent=1)
