"""K-major (grouped) V copy: BLOCK_S x warps, interleaved; GB/s = (read + write) / time."""
import json, os, torch
from tileattn import fp8
from tileattn.bench.common import device_facts, spin_up, time_ms
from tileattn.kernels.attention import layout
CONFIGS = [(64, 4), (128, 4), (128, 8), (256, 8), (64, 8), (32, 4)]
spin_up()
rows = []
for shape in ((4, 16384, 32, 128), (4, 4096, 32, 256), (4, 16384, 8, 128)):
    v = torch.randn(*shape, device="cuda").to(torch.float8_e4m3fn)
    nbytes = 2 * v.numel()
    ref = None
    res = {c: [] for c in CONFIGS}
    for rnd in range(3):
        for c in CONFIGS:
            layout.BLOCK_S, layout.TRANSPOSE_WARPS = c
            out = fp8.k_major_copy(v, grouped=True)
            if ref is None:
                ref = out.clone()
            assert torch.equal(out.view(torch.uint8), ref.view(torch.uint8)), c
            res[c].append(round(nbytes / time_ms(lambda: fp8.k_major_copy(v, grouped=True)) / 1e6))
    print(shape, {f"{c[0]}x{c[1]}": r for c, r in res.items()}, flush=True)
    rows.append(dict(shape=shape, gbps={f"{c[0]}x{c[1]}": r for c, r in res.items()}))
json.dump(dict(device_facts(), rows=rows), open(os.path.join(os.environ.get("OUT", "."), "transpose-ab.json"), "w"), indent=1)
