"""A/B: fwd+bwd of flex document masking, gathering mask hook vs per-row key intervals
(flex/row_bounds.py), one process, interleaved, torch's compiled flex in the same run."""
import json, os, sys, time
import torch, triton, tileattn
import tileattn.ops.flex as flex_op, tileattn.ops.flex_backward as flex_bwd
from tileattn.flex import row_bounds
sys.path.insert(0, "benchmarks")
from flex_mods import masks_and_mods
from tileattn.bench import flex_peer
from torch.nn.attention.flex_attention import create_block_mask, flex_attention
torch._dynamo.config.cache_size_limit = 1000
torch._dynamo.config.accumulated_cache_size_limit = 1000
T0 = time.time()
dev = "cuda"; D = 128
real = row_bounds.interval_mask
rounds = int(os.environ.get("ROUNDS", "5"))
table = {}
compiled_flex = torch.compile(flex_attention)
for n in [int(x) for x in os.environ.get("NS", "16384").split(",")]:
    case = "document"
    torch.manual_seed(0)
    mask_mod, score_mod, mask_batch = masks_and_mods(case, n, dev)
    bm = create_block_mask(mask_mod, mask_batch, None, n, n, device=dev)
    q, k, v = (torch.randn(4, 32, n, D, device=dev, dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    go = torch.randn(4, 32, n, D, device=dev, dtype=torch.bfloat16)
    flops = flex_peer.mask_flops(mask_mod, mask_batch, 32, D, n, n, dev) * (4 // mask_batch) * 3.5
    def step(fn):
        out = fn(q, k, v, block_mask=bm)
        out.backward(go)
        return out
    fns = {"hook": lambda: step(tileattn.flex_attention), "intervals": lambda: step(tileattn.flex_attention),
           "flex": lambda: step(compiled_flex)}
    def use(name):
        f = real if name == "intervals" else (lambda *a, **kw: None)
        flex_op.interval_mask = f; flex_bwd.interval_mask = f
    grads = {}
    for name, fn in fns.items():
        use(name); q.grad = k.grad = v.grad = None
        fn(); torch.cuda.synchronize()
        grads[name] = [x.grad.float() for x in (q, k, v)]
    print(f"[{time.time() - T0:.0f}s] N={n} max |hook - intervals| grads", [float((a - b).abs().max()) for a, b in zip(grads["hook"], grads["intervals"])],
          "rel vs flex", [float((a - b).norm() / b.norm()) for a, b in zip(grads["intervals"], grads["flex"])], flush=True)
    row = table.setdefault(f"{case}-{n}", {})
    for r in range(rounds):
        for name, fn in fns.items():
            use(name)
            ms = triton.testing.do_bench(fn, warmup=10, rep=100, grad_to_none=[q, k, v])
            row.setdefault(name, []).append(round(flops / ms / 1e9, 1))
    med = {k2: sorted(v2)[len(v2) // 2] for k2, v2 in row.items()}
    print(f"[{time.time() - T0:.0f}s] N={n}: {row} intervals/hook {med['intervals'] / med['hook']:.3f}; vs flex hook {med['hook'] / med['flex']:.3f} intervals {med['intervals'] / med['flex']:.3f}", flush=True)
    del q, k, v, go
    torch.cuda.empty_cache()
use("intervals")
json.dump(table, open(os.path.join(os.environ.get("OUT", "."), "rows_bwd_ab.json"), "w"), indent=1)
