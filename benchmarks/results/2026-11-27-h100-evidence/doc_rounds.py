"""The mods grid's document point (bf16) alone, ROUNDS interleaved rounds (flex_mods.measure)."""
import json, os, sys, torch
sys.path.insert(0, "benchmarks")
import flex_mods
from tileattn.bench.common import spin_up, device_facts
flex_mods.ROUNDS = int(os.environ.get("ROUNDS", "9"))
dev = torch.device("cuda"); spin_up()
inputs = flex_mods.make_inputs(16384, dev)
rows = flex_mods.measure(dict(case="document", dtype="bf16", N=16384), inputs, dev)
t = {r["impl"]: r for r in rows}
ratios = [f / o for o, f in zip(t["tileattn"]["ms_rounds"], t["flex"]["ms_rounds"])]
print("ratio of medians", t["flex"]["ms"] / t["tileattn"]["ms"], "per round", [round(x, 3) for x in ratios])
json.dump(dict(device_facts(), rounds=flex_mods.ROUNDS, rows=rows, round_ratios=ratios),
          open(os.path.join(os.environ.get("OUT", "."), "document-rounds.json"), "w"), indent=1)
