"""MUFU throughput on this GPU: tanh.approx.f32 vs ex2.approx.f32 (and f16x2 forms), a dependent
chain per element, 64 independent elements a thread; results per clock per SM from the
median time and the SM clock read during the run."""
import json, os, subprocess, torch, triton, triton.language as tl
from tileattn.bench.common import spin_up, device_facts

@triton.jit
def chain(x_ptr, out_ptr, ITERS: tl.constexpr, OP: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    y = tl.load(x_ptr + offs)
    for _ in range(ITERS):
        if OP == 0:
            y = tl.inline_asm_elementwise("tanh.approx.f32 $0, $1;", "=f,f", [y], dtype=tl.float32, is_pure=True, pack=1)
        elif OP == 1:
            y = tl.inline_asm_elementwise("ex2.approx.ftz.f32 $0, $1;", "=f,f", [-y], dtype=tl.float32, is_pure=True, pack=1)
        elif OP == 2:
            y = tl.inline_asm_elementwise("{.reg .b32 t; cvt.rn.f16x2.f32 t, $1, $1; tanh.approx.f16x2 t, t; mov.b32 {$0, _}, t;}" , "=h,f", [y], dtype=tl.float16, is_pure=True, pack=1).to(tl.float32)
        else:
            y = y * 0.999 + 0.0001
    tl.store(out_ptr + offs, y)

spin_up()
sms = torch.cuda.get_device_properties(0).multi_processor_count
WARPS, PER_THREAD, ITERS = 8, 32, 2048
BLOCK = WARPS * 32 * PER_THREAD
programs = sms * 2
x = torch.rand(programs * BLOCK, device="cuda") * 0.5 + 0.1
out = torch.empty_like(x)
rows = []
for op, name in ((0, "tanh.approx.f32"), (1, "ex2.approx.f32"), (3, "ffma"), (0, "tanh.approx.f32"), (1, "ex2.approx.f32")):
    fn = lambda: chain[(programs,)](x, out, ITERS=ITERS, OP=op, BLOCK=BLOCK, num_warps=WARPS)
    fn(); torch.cuda.synchronize()
    ms = triton.testing.do_bench(fn, warmup=50, rep=500, return_mode="median")
    clock = subprocess.run(["nvidia-smi", "--query-gpu=clocks.sm", "--format=csv,noheader,nounits"], capture_output=True, text=True).stdout.strip()
    ops = programs * BLOCK * ITERS
    per_clk = ops / (ms * 1e-3) / (sms * float(clock) * 1e6)
    print(f"{name}: {ms:.3f} ms, {ops / ms / 1e9:.1f} Gop/s, SM clock after {clock} MHz -> {per_clk:.1f} per clock per SM", flush=True)
    rows.append(dict(op=name, ms=ms, clock_mhz_after=float(clock), per_clock_per_sm=per_clk))
json.dump(dict(device_facts(), rows=rows), open(os.path.join(os.environ.get("OUT", "."), "mufu-rate.json"), "w"), indent=1)
