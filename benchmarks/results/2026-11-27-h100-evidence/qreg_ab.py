"""Interleaved A/B of sm90 forward config rows through attention(); cuDNN bf16 in the same run."""
import json, os, sys, time, dataclasses
import torch, torch.nn.functional as F
import tileattn
from tileattn.ops import call_cache
from tileattn.kernels.attention import sm90
from tileattn.bench.common import spin_up, time_ms, device_facts
from torch.nn.attention import sdpa_kernel, SDPBackend

B, H = 4, 32
C = sm90.Sm90Config
base_long = dict(sm90.LONG_QUERY_CONFIGS); base_fp8 = dict(sm90.FP8_CONFIGS); base = dict(sm90.CONFIGS)

base_short = dict(sm90.SHORT_QUERY_CONFIGS)
def setv(name):
    for table, b in ((sm90.LONG_QUERY_CONFIGS, base_long), (sm90.FP8_CONFIGS, base_fp8),
                     (sm90.CONFIGS, base), (sm90.SHORT_QUERY_CONFIGS, base_short)):
        table.clear(); table.update(b)
    if name == "r248":
        for table in (sm90.CONFIGS, sm90.SHORT_QUERY_CONFIGS, sm90.FP8_CONFIGS):
            for d in list(table):
                if table[d].block_m == 128:
                    table[d] = dataclasses.replace(table[d], consumer_regs=248)
    if name == "s3q":
        sm90.SHORT_QUERY_CONFIGS[64] = C(128, 3, split=True, q_in_registers=True)
    if name == "n64q":
        sm90.SHORT_QUERY_CONFIGS[64] = C(64, 3, split=True, q_in_registers=True)
    if name == "n64s4q":
        sm90.SHORT_QUERY_CONFIGS[64] = C(64, 4, split=True, q_in_registers=True)
    if name.startswith("tail"):
        st = 3 if name == "tail3" else 2
        sm90.FP8_CONFIGS[128] = C(128, st, split=True, tail_n=64)
    if name == "qreg":
        for table in (sm90.CONFIGS, sm90.SHORT_QUERY_CONFIGS):
            for d in (64, 128):
                if d in table:
                    table[d] = dataclasses.replace(table[d], q_in_registers=True)
        sm90.FP8_CONFIGS[128] = dataclasses.replace(sm90.FP8_CONFIGS[128], q_in_registers=True)
    call_cache.clear_all()

VARIANTS = sys.argv[1].split(",") if len(sys.argv) > 1 else ["base", "qreg"]
POINTS_ENV = os.environ.get("POINTS")
POINTS = [(128, 4096, False, "bf16"), (128, 4096, True, "bf16"), (128, 16384, False, "bf16"),
          (128, 16384, True, "bf16"), (128, 4096, False, "e4m3"), (128, 16384, False, "e4m3"),
          (128, 16384, True, "e4m3")]
if POINTS_ENV:
    POINTS = [(int(a), int(b), c == "1", d, float(e)) for a, b, c, d, e in (x.split(":") for x in POINTS_ENV.split())]
else:
    POINTS = [p + (0.0,) for p in POINTS]
ROUNDS = int(os.environ.get("ROUNDS", 3))

from tileattn.bench import flex_peer
from torch.nn.attention.flex_attention import create_block_mask
def doc_case(n, d):
    g = torch.Generator(device="cuda").manual_seed(5)
    cuts = [torch.sort(torch.randperm(n - 1, generator=g, device="cuda")[:15] + 1).values for _ in range(B)]
    pos = torch.arange(n, device="cuda")
    ids = torch.stack([torch.searchsorted(c, pos, right=True) for c in cuts]).to(torch.int32)
    mask = flex_peer.document_causal(ids)
    bm = create_block_mask(mask, B, None, n, n, device="cuda")
    vis = sum(((ids[b][:, None] == ids[b][None, :]) & (pos[:, None] >= pos[None, :])).sum().item() for b in range(B))
    return bm, 4 * d * H * vis

def flops(n, d, causal):
    f = 4 * B * H * n * n * d
    return f / 2 if causal else f

inputs = {}
def get(point):
    d, n, causal, dt, _ = point
    point = point[:4]
    if point not in inputs:
        g = torch.Generator(device="cuda").manual_seed(n + d)
        q, k, v = (torch.randn(B, n, H, d, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(3))
        if dt in ("bf16", "doc"):
            inputs[point] = ((q, k, v), {}, (q, k, v))
        else:
            (q8, qd), (k8, kd), (v8, vd) = (tileattn.quantize_fp8(x, torch.float8_e4m3fn) for x in (q, k, v))
            v8 = v8 if os.environ.get("VROW") == "1" else tileattn.prepare_v(v8)
            inputs[point] = ((q8, k8, v8), dict(q_descale=qd, k_descale=kd, v_descale=vd), (q, k, v))
    return inputs[point]

docs = {}
for p in POINTS:
    if p[3].startswith("doc"):
        docs[(p[1], p[0])] = doc_case(p[1], p[0])
spin_up()
rows, outs, refs = [], {}, {}
t0 = time.time()
for r in range(ROUNDS):
    for point in POINTS:
        d, n, causal, dt, softcap = point
        args, kw, ref = get(point)
        for name in VARIANTS:
            setv(name)
            if dt.startswith("doc"):
                bm, fl = docs[(n, d)]
                qf, kf, vf = (x.transpose(1, 2) for x in ref)
                fn = lambda: tileattn.flex_attention(qf, kf, vf, block_mask=bm)
            else:
                fn = lambda: tileattn.attention(*args, causal=causal, softcap=softcap, **kw)
            o = fn().float()
            err = None
            if r == 0 and os.environ.get("REF") == "1" and not dt.startswith("doc"):
                if point not in refs:
                    qr, kr, vr = (x.transpose(1, 2).float() for x in ref)
                    with sdpa_kernel([SDPBackend.EFFICIENT_ATTENTION]):
                        refs[point] = F.scaled_dot_product_attention(qr, kr, vr, is_causal=causal).transpose(1, 2) if softcap == 0 else None
                if refs[point] is not None:
                    err = ((o - refs[point]).norm() / refs[point].norm()).item()
            if r == 0:
                key = point
                if key not in outs:
                    outs[key] = o
                    diff = 0.0
                else:
                    diff = (o - outs[key]).abs().max().item()
            else:
                diff = None
            ms = time_ms(fn)
            rows.append(dict(round=r, D=d, N=n, causal=causal, dtype=dt, softcap=softcap, impl=name, ms=ms,
                             tflops=(fl if dt.startswith("doc") else flops(n, d, causal)) / ms / 1e9, maxdiff_vs_first=diff, err_vs_fp32=err))
            print(rows[-1], flush=True)
        if dt.startswith("doc"):
            continue
        if dt == "bf16" and softcap == 0 and os.environ.get("CUDNN", "1") == "1":
            q, k, v = (x.transpose(1, 2) for x in ref)
            def cud():
                with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
                    return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
            ms = time_ms(cud)
            rows.append(dict(round=r, D=d, N=n, causal=causal, dtype=dt, impl="cudnn", ms=ms,
                             tflops=flops(n, d, causal) / ms / 1e9))
            print(rows[-1], flush=True)
setv("base")
import collections
agg = collections.defaultdict(list)
for row in rows:
    agg[(row["D"], row["N"], row["causal"], row["dtype"], row.get("softcap", 0), row["impl"])].append(row["tflops"])
print("SUMMARY (median over rounds)")
for k, v in agg.items():
    v = sorted(v); print(k, round(v[len(v)//2], 1), [round(x) for x in v])
out = os.environ.get("OUT", ".")
json.dump(dict(device=device_facts(), date=time.strftime("%Y-%m-%d"), rows=rows, seconds=time.time() - t0),
          open(os.path.join(out, os.environ.get("NAME", "qreg-ab") + ".json"), "w"), indent=1)
