"""Cross-compile sm90 forward with custom LONG_QUERY_CONFIGS rows. usage: xc.py D block_n stages [causal...]"""
import sys, json, os, re
sys.path.insert(0, ".")
src = open("tests/test_sm90_cross_compile.py").read()
child = src.split("CHILD = r'''")[1].split("rows = {}")[0]
os.environ.pop("TRITON_INTERPRET", None)
g = {}
exec(child, g)
sm90 = g["sm90"]
d, bn, st = map(int, sys.argv[1:4])
bm = int(sys.argv[4]) if len(sys.argv) > 4 else 192
dtype = sys.argv[5] if len(sys.argv) > 5 else "bf16"
cfg = sm90.Sm90Config(bn, st, block_m=bm, split=True)
sm90.LONG_QUERY_CONFIGS[d] = cfg
if dtype != "bf16": sm90.FP8_CONFIGS[d] = cfg
for causal in (False, True):
    r = g["compile_case"](dtype, d, causal, long=True)
    print(d, bn, st, bm, causal, {k: r[k] for k in ("shared", "stack", "local", "local_in_key_loops", "key_loops", "shfl_per_key_loop", "hgmma")}, flush=True)
