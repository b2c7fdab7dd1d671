"""Host time of attention() forward + backward with kernel launches stubbed, on CPU tensors,
dispatching as on an H100 (sm90 row)."""
import time, sys, cProfile, pstats, os
os.environ["TRITON_INTERPRET"] = "1"
import torch
import tileattn
from tileattn import arch as arch_mod
from tileattn.kernels import runtime
import tileattn.ops.attention as ops_attention
import tileattn.ops.backward as ops_backward
SM90 = arch_mod.arch_for_capability((9, 0))
for m in (ops_attention, ops_backward):
    m.arch_of = lambda device: SM90
runtime.KernelLaunch.run = lambda self: None
launches = []
orig_init = runtime.KernelLaunch.__init__
def spy(self, *a, **k):
    orig_init(self, *a, **k); launches.append(getattr(self.kernel, "__name__", str(self.kernel)))
runtime.KernelLaunch.__init__ = spy

B, N, H, D = 1, int(sys.argv[1]) if len(sys.argv) > 1 else 1024, 2, 128
q, k, v = (torch.randn(B, N, H, D, dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
g = torch.randn(B, N, H, D, dtype=torch.bfloat16)

def step():
    out = tileattn.attention(q, k, v, causal=True)
    out.backward(g)

for _ in range(3):
    step()
print("launches per step:", launches[-10:], len(launches) // 3)
n = 50
t = time.perf_counter()
for _ in range(n):
    step()
print(f"host per fwd+bwd step: {(time.perf_counter() - t) / n * 1e6:.0f} us")
def fwd_only():
    with torch.no_grad():
        tileattn.attention(q, k, v, causal=True)
t = time.perf_counter()
for _ in range(n):
    fwd_only()
print(f"host per no-grad forward: {(time.perf_counter() - t) / n * 1e6:.0f} us")
if "--profile" in sys.argv:
    pr = cProfile.Profile(); pr.enable()
    for _ in range(20): step()
    pr.disable()
    pstats.Stats(pr).sort_stats("cumulative").print_stats(35)

if "--parts" in sys.argv:
    from tileattn.ops import library, backward as bops
    args = (q, k, v, True, 0.125, -1, -1, 0.0, None, None, None, None, None, False)
    def timeit(label, fn, n=200):
        fn(); t = time.perf_counter()
        for _ in range(n): fn()
        print(f"{label}: {(time.perf_counter() - t) / n * 1e6:.0f} us")
    with torch.no_grad():
        timeit("attention_impl (fwd, lse)", lambda: library.attention_impl(*args))
        timeit("public no-grad fwd, lse", lambda: tileattn.attention(q, k, v, causal=True, return_lse=True))
        out, lse = library.attention_impl(*args)
        dl = torch.zeros_like(lse)
        timeit("backward_impl", lambda: bops.backward_impl(g, dl, q, k, v, out, lse, None, None, 0, 0, True, 0.125, -1, -1, 0.0, None, False))
        from tileattn.kernels.attention import bwd
        delta, acc = bwd.backward_workspace(q, lse, True)
        dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
        timeit("backward_launches", lambda: bwd.backward_launches(q, k, v, out, lse, g, dq, dk, dv, delta, None, causal=True, softmax_scale=0.125, window_left=-1, window_right=0, arch=SM90, kernel="sm90"))
