"""A/B (2x2, interleaved): the key loop carrying P in fp32 (sm90.P_CARRY_F32) and out/lse stores
evict-first (sm90.OUT_EVICTION), Hopper forward, bf16."""
import importlib.util, itertools, json, os, time, torch
import tileattn
from tileattn.bench.common import device_facts, spin_up, time_ms
from tileattn.bench import flex_peer
from tileattn.kernels.attention import sm90
from tileattn.ops import call_cache
from tileattn.flex import flex_attention
from torch.nn.attention.flex_attention import create_block_mask
spec = importlib.util.spec_from_file_location("flex_mods", "benchmarks/flex_mods.py")
fm = importlib.util.module_from_spec(spec); spec.loader.exec_module(fm)
ROUNDS = int(os.environ.get("ROUNDS", "3"))
spin_up()
def dense(B, N, D, causal, softcap=0.0):
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(B, N, 32, D, device="cuda", generator=g, dtype=torch.bfloat16) for _ in range(3))
    fl = 4 * B * 32 * N * N * D * (0.5 if causal else 1.0)
    return (lambda: tileattn.attention(q, k, v, causal=causal, softcap=softcap)), fl
cases = {}
for B, N, D, c, sc in ((4, 16384, 64, False, 0.0), (4, 16384, 128, False, 0.0), (4, 16384, 128, True, 0.0),
                       (4, 16384, 128, True, 30.0), (4, 16384, 256, False, 0.0), (16, 1024, 128, True, 0.0),
                       (4, 4096, 64, True, 0.0)):
    cases[f"B{B} N{N} D{D} {'causal' if c else 'full'}{' softcap' if sc else ''}"] = dense(B, N, D, c, sc)
N = fm.CONTEXT
inputs = fm.make_inputs(N, "cuda")
mask_mod, score_mod, mb = fm.masks_and_mods("document", N, "cuda")
bm = create_block_mask(mask_mod, mb, 1, N, N, device="cuda")
flops = flex_peer.mask_flops(mask_mod, fm.BATCH, fm.HEADS, fm.HEAD_DIM, N, N, "cuda")
ops_ = inputs["bf16"][0]
cases["flex document 16k"] = ((lambda: flex_attention(*ops_, block_mask=bm)), flops)
variants = list(itertools.product((False, True), ("", "evict_first")))
rows = []
t0 = time.time()
for name, (call, flops) in cases.items():
    outs, tf = {}, {v: [] for v in variants}
    for rnd in range(ROUNDS):
        for var in (variants if rnd % 2 == 0 else variants[::-1]):
            sm90.P_CARRY_F32, sm90.OUT_EVICTION = var
            call_cache.clear_all()
            o = call()
            if rnd == 0:
                outs[var] = o.float()
            tf[var].append(round(flops / time_ms(call) / 1e9))
    same = all(torch.equal(outs[variants[0]], outs[v]) for v in variants)
    row = dict(case=name, equal=same, **{f"carry_f32={c} evict={e or 'none'}": tf[(c, e)] for c, e in variants})
    print(round(time.time() - t0), row, flush=True)
    rows.append(row)
json.dump(dict(device_facts(), rows=rows), open(os.path.join(os.environ.get("OUT", "."), "carry-evict-ab.json"), "w"), indent=1)
