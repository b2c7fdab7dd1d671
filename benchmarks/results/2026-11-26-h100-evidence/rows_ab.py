"""A/B: a gathering mask hook (document masking) vs per-row key intervals (flex/row_bounds.py),
one process, interleaved, with torch's compiled flex in the same run."""
import json, os, sys, time
import torch, triton, tileattn
import tileattn.ops.flex as flex_op
from tileattn.flex import row_bounds
sys.path.insert(0, "benchmarks")
from flex_mods import masks_and_mods
from tileattn.bench import flex_peer
from torch.nn.attention.flex_attention import create_block_mask, flex_attention
torch._dynamo.config.cache_size_limit = 1000
torch._dynamo.config.accumulated_cache_size_limit = 1000

T0 = time.time()
dev = "cuda"; D = 128; n = 16384
real = flex_op.interval_mask
rounds = int(os.environ.get("ROUNDS", "5"))
table = {}
compiled_flex = torch.compile(flex_attention)
for case in os.environ.get("CASES", "document").split(","):
    for dtype in os.environ.get("DTYPES", "bf16,fp8").split(","):
        torch.manual_seed(0)
        mask_mod, score_mod, mask_batch = masks_and_mods(case, n, dev)
        bm = create_block_mask(mask_mod, mask_batch, None, n, n, device=dev)
        q, k, v = (torch.randn(4, 32, n, D, device=dev, dtype=torch.bfloat16) for _ in range(3))
        if dtype == "fp8":
            q, k, v = (x.to(torch.float8_e4m3fn) for x in (q, k, v))
        flops = flex_peer.mask_flops(mask_mod, mask_batch, 32, D, n, n, dev) * (4 // mask_batch)
        fns = {"hook": lambda: tileattn.flex_attention(q, k, v, block_mask=bm, score_mod=score_mod),
               "intervals": lambda: tileattn.flex_attention(q, k, v, block_mask=bm, score_mod=score_mod)}
        if dtype == "bf16":
            fns["flex"] = lambda: compiled_flex(q, k, v, block_mask=bm, score_mod=score_mod)
        def use(name):
            flex_op.interval_mask = real if name == "intervals" else (lambda *a, **kw: None)
        outs = {}
        for name, fn in fns.items():
            use(name)
            torch.cuda.synchronize(); t = time.time()
            outs[name] = fn().float(); torch.cuda.synchronize()
            print(f"[{time.time() - T0:.0f}s] {case} {dtype} {name}: first call {time.time() - t:.2f}s", flush=True)
        # the evaluation alone, uncached
        row_bounds._INTERVALS.clear(); use("intervals"); torch.cuda.synchronize(); t = time.time()
        fns["intervals"](); torch.cuda.synchronize()
        print(f"{case} {dtype}: call with a fresh interval evaluation {1e3 * (time.time() - t):.2f} ms; "
              f"intervals found: {any(v[1] is not None for v in row_bounds._INTERVALS.values())}", flush=True)
        print(f"{case} {dtype}: max |hook - intervals| {float((outs['hook'] - outs['intervals']).abs().max()):.3g}", flush=True)
        row = table.setdefault(f"{case}-{dtype}", {})
        for r in range(rounds):
            for name, fn in fns.items():
                use(name)
                ms = triton.testing.do_bench(fn, warmup=25, rep=150)
                row.setdefault(name, []).append(round(flops / ms / 1e9, 1))
        med = {k2: sorted(v2)[len(v2) // 2] for k2, v2 in row.items()}
        msg = f"intervals/hook {med['intervals'] / med['hook']:.3f}"
        if "flex" in med:
            msg += f"; vs flex: hook {med['hook'] / med['flex']:.3f} intervals {med['intervals'] / med['flex']:.3f}"
        print(f"[{time.time() - T0:.0f}s] {case} {dtype}: {row} {msg}", flush=True)
        del q, k, v
        torch.cuda.empty_cache()
flex_op.interval_mask = real
json.dump(table, open(os.path.join(os.environ.get("OUT", "."), "rows_ab.json"), "w"), indent=1)
