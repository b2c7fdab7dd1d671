"""A/B: flex_attention FP8 (portable kernel) tile configs and head groups vs the dedicated
causal path and compiled Flex FP8, N=16k, B=4, H=32, D=128."""
import json, math, os, torch, triton
import tileattn
from tileattn.bench import flex_peer
from tileattn.bench.common import spin_up, time_ms
from tileattn.flex import flex_attention
from tileattn.kernels.attention import fwd
from tileattn.kernels.attention.configs import TileConfig
from torch.nn.attention.flex_attention import create_block_mask
dev = torch.device("cuda")
B, H, N, D = 4, 32, 16384, 128
OUT = os.environ.get("OUT", ".")
gen = torch.Generator(device=dev).manual_seed(0)
inputs = [torch.randn(B, H, N, D, device=dev, generator=gen) for _ in range(3)]
(q, qd), (k, kd), (v, vd) = [tileattn.quantize_fp8(x) for x in inputs]
del inputs
scale = 1 / math.sqrt(D)
PREFIX = 2048
def prefix_lm(b, h, q_idx, kv_idx):
    return (kv_idx < PREFIX) | (q_idx >= kv_idx)
masks = {"causal": flex_peer.causal, "prefix_lm": prefix_lm}
orig_config_for, orig_hpg = fwd.config_for, fwd.heads_per_group
CONFIGS = {"cur": None, "128x128x8x3": TileConfig(128, 128, 8, 3), "128x128x8x2": TileConfig(128, 128, 8, 2),
           "64x128x4x4": TileConfig(64, 128, 4, 4), "64x128x4x2": TileConfig(64, 128, 4, 2)}
def setup(cfg, groups):
    fwd.config_for = (lambda *a, **kw: cfg) if cfg is not None else orig_config_for
    fwd.heads_per_group = (lambda causal, *a: orig_hpg(True, *a)) if groups else orig_hpg
compiled = flex_peer.compiled_flex_attention()
spin_up()
rows = []
for case, mm in masks.items():
    bm = create_block_mask(mm, 1, 1, N, N, device=dev)
    flops = flex_peer.mask_flops(mm, B, H, D, N, N, dev)
    calls = {}
    for name, cfg in CONFIGS.items():
        for groups in (False, True):
            if groups and name not in ("cur", "128x128x8x3"):
                continue
            calls[f"tileattn-{name}{'-groups' if groups else ''}"] = ((cfg, groups), lambda: flex_attention(q, k, v, block_mask=bm, q_descale=qd, k_descale=kd, v_descale=vd))
    if case == "causal":
        qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))
        calls["dedicated"] = ((None, False), lambda: tileattn.attention(qt, kt, vt, causal=True, q_descale=qd, k_descale=kd, v_descale=vd))
    calls["flex"] = ((None, False), lambda: compiled(q, k, v, block_mask=bm, scale=scale * float(qd) * float(kd)).float() * float(vd))
    ref = None
    errs = {}
    for name, ((cfg, groups), fn) in calls.items():
        setup(cfg, groups)
        o = fn()
        o = o.float() if name != "dedicated" else o.float().transpose(1, 2)
        if ref is None:
            ref = o
        errs[name] = float((o - ref).norm() / ref.norm())
    ms = {n: [] for n in calls}
    for rep in range(3):
        for name, ((cfg, groups), fn) in calls.items():
            setup(cfg, groups)
            ms[name].append(time_ms(fn))
    setup(None, False)
    tf = {n: flops / min(m) / 1e9 for n, m in ms.items()}
    r = dict(case=case, N=N, ms=ms, tflops=tf, vs_flex={n: t / tf["flex"] for n, t in tf.items()}, err_vs_first=errs)
    rows.append(r)
    print(case, {n: round(t) for n, t in tf.items()}, {n: round(x, 3) for n, x in r["vs_flex"].items()}, {n: f"{e:.1e}" for n, e in errs.items()}, flush=True)
    json.dump(dict(device=torch.cuda.get_device_name(), torch=torch.__version__, triton=triton.__version__, rows=rows), open(os.path.join(OUT, "flex-fp8-ab.json"), "w"), indent=1)
