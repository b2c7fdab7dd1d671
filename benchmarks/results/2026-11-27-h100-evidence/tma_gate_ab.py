"""Interleaved A/B: TMA stores of O gated on all keys (old: none at N=16k) vs on the keys a tile
walks (new: a block mask's mean, a causal window's span). Flex's compiled peer in the same run."""
import json, os, sys, time, statistics, math
sys.path.insert(0, "benchmarks")
import torch
import tileattn
import flex_mods as fm
from tileattn.ops import call_cache
from tileattn.kernels.attention import sm90
from tileattn.bench.common import spin_up, time_ms, device_facts
from tileattn.bench import flex_peer
from tileattn.flex import flex_attention
from torch.nn.attention.flex_attention import create_block_mask

new_desc = sm90._out_descriptor
def setv(name):
    sm90._out_descriptor = (lambda *a, **k: None) if name == "old" else new_desc
    call_cache.clear_all()

ROUNDS = int(os.environ.get("ROUNDS", 3))
N = int(os.environ.get("N", 16384))
POINTS = os.environ.get("POINTS", "document:bf16 document:fp8e4m3 sliding_window:bf16 sliding_window:fp8e4m3 dense_window:bf16").split()
spin_up()
inputs = fm.make_inputs(N, "cuda")
compiled = flex_peer.compiled_flex_attention()
rows = []
t0 = time.time()
for point in POINTS:
    case, dtype = point.split(":")
    ops, (qd, kd, vd) = inputs[dtype]
    kw = {} if dtype == "bf16" else dict(q_descale=qd, k_descale=kd, v_descale=vd)
    if case == "dense_window":
        q, k, v = (x.transpose(1, 2) for x in ops)
        fn = lambda: tileattn.attention(q, k, v, causal=True, window_size=(fm.WINDOW, 0), **kw)
        fl = 4 * fm.BATCH * fm.HEADS * fm.HEAD_DIM * sum(min(i + 1, fm.WINDOW + 1) for i in range(N))
        peer = None
    else:
        mask_mod, score_mod, mb = fm.masks_and_mods(case, N, "cuda")
        bm = create_block_mask(mask_mod, mb, 1, N, N, device="cuda")
        fl = flex_peer.mask_flops(mask_mod, fm.BATCH, fm.HEADS, fm.HEAD_DIM, N, N, "cuda")
        fn = lambda: flex_attention(*ops, score_mod=score_mod, block_mask=bm, **kw)
        if dtype == "bf16":
            peer = lambda: compiled(*ops, score_mod=score_mod, block_mask=bm)
        else:
            sc, vs = float(qd) * float(kd) / math.sqrt(fm.HEAD_DIM), float(vd)
            peer = lambda: compiled(*ops, score_mod=score_mod, block_mask=bm, scale=sc).float() * vs
    outs = {}
    for name in ("old", "new"):
        setv(name)
        o = fn(); o = o[0] if isinstance(o, tuple) else o
        outs[name] = o.float().clone()
    same = torch.equal(outs["old"], outs["new"])
    names = ["old", "new"] + (["flex"] if peer else [])
    times = {n: [] for n in names}
    for r in range(ROUNDS):
        for name in (names if r % 2 == 0 else names[::-1]):
            if name == "flex":
                peer(); times[name].append(time_ms(peer)); continue
            setv(name); fn()
            times[name].append(time_ms(fn))
    for name in names:
        ms = statistics.median(times[name])
        rows.append(dict(point=point, N=N, impl=name, ms=ms, ms_rounds=times[name], tflops=fl / ms / 1e9, bit_equal=same))
        print(rows[-1], flush=True)
setv("new")
print("SUMMARY")
for point in POINTS:
    sel = {r["impl"]: r for r in rows if r["point"] == point}
    print(point, f"old={sel['old']['tflops']:.0f} new={sel['new']['tflops']:.0f} ratio={sel['new']['tflops']/sel['old']['tflops']:.3f} bit_equal={sel['new']['bit_equal']}",
          f"flex={sel['flex']['tflops']:.0f} new/flex={sel['new']['tflops']/sel['flex']['tflops']:.3f} old/flex={sel['old']['tflops']/sel['flex']['tflops']:.3f}" if "flex" in sel else "")
json.dump(dict(device=device_facts(), date=time.strftime("%Y-%m-%d"), rows=rows, seconds=time.time() - t0),
          open(os.path.join(os.environ.get("OUT", "."), os.environ.get("NAME", "tma-gate-ab") + ".json"), "w"), indent=1)
