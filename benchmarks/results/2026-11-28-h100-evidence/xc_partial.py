"""Cross-compile FP8 (grouped V) and bf16-with-lse rows with ROW_SUMS forced to PARTIAL vs as is."""
import sys, os
sys.path.insert(0, ".")
src = open("tests/test_sm90_cross_compile.py").read()
child = src.split("CHILD = r'''")[1].split("rows = {}")[0]
os.environ.pop("TRITON_INTERPRET", None)
g = {}
exec(child, g)
sm90 = g["sm90"]
orig = sm90.attention_sm90_launch
FORCE = {"on": False}
def patched(*a, **kw):
    l = orig(*a, **kw)
    if FORCE["on"] and l.constexprs["ROW_SUMS"] == 0:
        l.constexprs["ROW_SUMS"] = 2
    return l
g["sm90"].attention_sm90_launch = patched
cases = [(a, dict(kw)) for a, kw in [(("e4m3", 128, False), dict(grouped=True)), (("e4m3", 128, True), dict(grouped=True)),
         (("e4m3", 256, True), dict(grouped=True)), (("bf16", 128, False), {}), (("bf16", 128, True), {})]]
for args, kw in cases:
    for on in (False, True):
        FORCE["on"] = on
        r = g["compile_case"](*args, **kw)
        print(args, "partial" if on else "as-is", {k: r[k] for k in ("shared", "local", "local_in_key_loops", "shfl_per_key_loop", "fadd_per_key_loop")}, flush=True)
