"""tileattn bf16 (and fp8 e4m3) vs cuDNN bf16 (and FP8) vs FlashAttention-4 bf16, interleaved
rounds, prefill's shapes (B=4, H=32, [B, N, H, D]); writes rows after every point."""
import json, os, sys, time, statistics
import torch
from tileattn.bench import prefill
from tileattn.bench.common import spin_up, time_interleaved, device_facts

COLUMNS = [("tileattn", "bf16"), ("cudnn", "bf16"), ("fa4", "bf16")]
dims = [int(x) for x in os.environ.get("DIMS", "128 256 64").split()]
contexts = [int(x) for x in os.environ.get("NS", "4096 16384 1024").split()]
table = prefill.providers(("cudnn", "fa4"))
cols = [c for c in COLUMNS if c in table]
print("columns", cols, flush=True)
device = torch.device("cuda")
facts = device_facts(device)
path = os.path.join(os.environ.get("OUT", "."), "d64-tail-probe.json")
rows, errors = [], []
t0 = time.time()
spin_up()
for head_dim in dims:
    for context in contexts:
        for causal in (False, True):
            if time.time() - t0 > float(os.environ.get("BUDGET", 480)):
                break
            gen = torch.Generator(device=device).manual_seed(context + head_dim)
            shape = (prefill.BATCH, context, prefill.HEADS, head_dim)
            q, k, v = (torch.randn(shape, device=device, generator=gen) for _ in range(3))
            want = prefill._yardstick(table, q, k, v, causal)
            calls = {}
            for col in cols:
                prep, call = table[col]
                try:
                    args, kwargs = prep(q, k, v)
                    out = call(*args, causal, **kwargs)
                    err = float((out.float() - want).norm() / want.norm())
                    if err < prefill.CHECK_TOLERANCE[prefill.precision(col[1])]:
                        calls[col] = (lambda call=call, args=args, kwargs=kwargs: call(*args, causal, **kwargs))
                    else:
                        errors.append((col, head_dim, context, causal, err))
                except Exception as e:
                    errors.append((col, head_dim, context, causal, f"{type(e).__name__}: {str(e)[:200]}"))
            times = time_interleaved(calls)
            fl = prefill.flops(context, head_dim, causal)
            for (impl, dt), t in times.items():
                ms = statistics.median(t)
                rows.append({"D": head_dim, "causal": causal, "N": context, "impl": impl, "dtype": dt,
                             "ms": ms, "ms_rounds": t, "tflops": fl / ms / 1e9})
            cell = {c: fl / statistics.median(t) / 1e9 for c, t in times.items()}
            print(head_dim, context, causal, {f"{a}-{b}": round(x) for (a, b), x in cell.items()},
                  "bf16/fa4=%.3f" % (cell[("tileattn", "bf16")] / cell[("fa4", "bf16")]) if ("fa4", "bf16") in cell else "",
                  round(time.time() - t0), flush=True)
            json.dump({**facts, "batch": prefill.BATCH, "heads": prefill.HEADS, "rounds": 3,
                       "rows": rows, "errors": errors, "seconds": time.time() - t0},
                      open(path, "w"), indent=1)
            del q, k, v, want
            torch.cuda.empty_cache()
print("errors", errors)
