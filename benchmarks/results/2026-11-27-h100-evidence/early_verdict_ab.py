"""A/B: flex mask hook's verdict before the S wait (sm90.EARLY_MASK_VERDICT) vs after, mods-grid cases, interleaved."""
import importlib.util, json, os, torch
from tileattn.bench.common import device_facts, spin_up, time_ms
from tileattn.bench import flex_peer
from tileattn.kernels.attention import sm90
from tileattn.ops import call_cache
from tileattn.flex import flex_attention
from torch.nn.attention.flex_attention import create_block_mask
spec = importlib.util.spec_from_file_location("flex_mods", "benchmarks/flex_mods.py")
fm = importlib.util.module_from_spec(spec); spec.loader.exec_module(fm)
N = fm.CONTEXT
inputs = fm.make_inputs(N, "cuda")
spin_up()
rows = []
for case, dtype in (("document", "bf16"), ("prefix_lm", "bf16"), ("document", "fp8e4m3")):
    mask_mod, score_mod, mb = fm.masks_and_mods(case, N, "cuda")
    bm = create_block_mask(mask_mod, mb, 1, N, N, device="cuda")
    flops = flex_peer.mask_flops(mask_mod, fm.BATCH, fm.HEADS, fm.HEAD_DIM, N, N, "cuda")
    ops_, (qd, kd, vd) = inputs[dtype]
    kw = dict(score_mod=score_mod, block_mask=bm)
    if dtype != "bf16":
        kw.update(q_descale=qd, k_descale=kd, v_descale=vd)
    call = lambda: flex_attention(*ops_, **kw)
    outs, tf = {}, {False: [], True: []}
    for rnd in range(3):
        for early in (False, True):
            sm90.EARLY_MASK_VERDICT = early
            call_cache.clear_all()
            o = call()
            if rnd == 0:
                outs[early] = o.float()
            tf[early].append(round(flops / time_ms(call) / 1e9))
    same = bool(torch.equal(outs[False], outs[True]))
    print(case, dtype, "late", tf[False], "early", tf[True], "equal", same, flush=True)
    rows.append(dict(case=case, dtype=dtype, late=tf[False], early=tf[True], equal=same))
json.dump(dict(device_facts(), rows=rows), open(os.path.join(os.environ.get("OUT", "."), "early-verdict-ab.json"), "w"), indent=1)
