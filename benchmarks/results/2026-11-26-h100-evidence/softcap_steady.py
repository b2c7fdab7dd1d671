"""Softcap vs no softcap, the serving grid's points (benchmarks/serving.py prefill_calls: causal
B4 H32 N16k D128 bf16, cap 30), tileattn only, interleaved rounds after a spin-up; common.time_ms
(BENCHMARKS.md's do_bench settings)."""
import json, os, sys, time
import torch
sys.path.insert(0, "benchmarks")
import serving
from tileattn.bench.common import spin_up, time_ms
T0 = time.time()
rounds = int(os.environ.get("ROUNDS", "15"))
calls = {}
for case in ("softcap", "nosoftcap"):
    flops, impl_calls, _, _ = serving.prefill_calls(dict(case=case, dtype="bf16", N=serving.MASK_CONTEXT, batch=serving.BATCH), torch.device("cuda"))
    calls[case] = (flops, dict((i, c) for i, c, _ in impl_calls)["tileattn"])
    calls[case][1](); torch.cuda.synchronize()
spin_up(float(os.environ.get("SPIN", "20")))
table = {}
for r in range(rounds):
    for case, (flops, call) in calls.items():
        table.setdefault(case, []).append(round(flops / time_ms(call) / 1e9, 1))
    print(f"[{time.time()-T0:.0f}s] round {r}: softcap {table['softcap'][-1]} nosoftcap {table['nosoftcap'][-1]} ratio {table['softcap'][-1] / table['nosoftcap'][-1]:.3f}", flush=True)
med = {k: sorted(v)[len(v) // 2] for k, v in table.items()}
print("medians", med, "ratio", round(med["softcap"] / med["nosoftcap"], 3), flush=True)
json.dump(table, open(os.path.join(os.environ.get("OUT", "."), f"softcap-steady-{os.environ.get('TAG', '0')}.json"), "w"), indent=1)
