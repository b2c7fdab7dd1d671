"""Registers, spills and shared memory of the backward kernels' config rows, without a GPU:
benchmarks/backward_registers.py cross-compiles the default dK/dV kernel (atomic dQ) and the
deterministic dQ kernel of every row of tileattn/kernels/attention/bwd.py's tables (or of the
candidate tiles given) for its chip, and runs Triton's ptxas -v on the PTX: the evidence behind
the tables' "no spills" rule. Needs TRITON_INTERPRET unset; slow where a tile spills heavily
(ptxas takes minutes then). Writes `backward-registers.json` under --out (default $OUT, else .).

    python benchmarks/backward_registers.py                    # every table row
    python benchmarks/backward_registers.py sm90 128 16,128,8,2 32,64,8,2
"""

from __future__ import annotations

import argparse
import re
import subprocess
import tempfile

import torch

from tileattn.bench.common import write_json

CAPABILITY = {"sm80": (8, 0), "sm89": (8, 9), "sm90": (9, 0)}


def report(name: str, width: int, kernel: str, tiles) -> dict:
    """Compile one (chip, padded head dim, kernel, tiles) causal bf16 launch; ptxas's report."""
    from triton.backends.nvidia.compiler import get_ptxas

    from tileattn.arch import arch_for_capability
    from tileattn.kernels.attention import bwd
    from tileattn.kernels.compile import cross_compile
    major, minor = CAPABILITY[name]
    arch = arch_for_capability((major, minor))
    q = torch.empty(2, 256, 4, width, dtype=torch.bfloat16)
    k = torch.empty(2, 256, 2, width, dtype=torch.bfloat16)
    lse = torch.empty(2, 4, 256)
    delta, dq_accum = bwd.backward_workspace(q, lse, kernel == "dq")
    # Arguments by position: q, k, v, out, lse, dout, dq, dk, dv (same shapes serve as each).
    launches = bwd.backward_launches(
        q, k, k, q, lse, q, q, k, k, delta, dq_accum, causal=True, softmax_scale=0.1,
        window_left=-1, window_right=-1, arch=arch, **{f"{kernel}_tiles": tiles})
    compiled = cross_compile(launches[1] if kernel == "dkdv" else launches[2], major * 10 + minor)
    with tempfile.NamedTemporaryFile("w", suffix=".ptx") as ptx:
        ptx.write(compiled.ptx)
        ptx.flush()
        gpu = f"sm_{major}{minor}" + ("a" if major == 9 else "")
        log = subprocess.run([get_ptxas(major * 10 + minor).path, "-v", f"--gpu-name={gpu}",
                              ptx.name, "-o", "/dev/null"], capture_output=True, text=True).stderr
    return {"arch": name, "width": width, "kernel": kernel,
            "tiles": [tiles.block_m, tiles.block_n, tiles.num_warps, tiles.num_stages],
            "shared": compiled.shared_bytes,
            "fits": compiled.shared_bytes <= arch.shared_memory_bytes,
            "registers": int(re.search(r"Used (\d+) registers", log).group(1)),
            "spill_bytes": int(re.search(r"(\d+) bytes spill stores", log).group(1))}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="python benchmarks/backward_registers.py",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("arch", nargs="?", choices=tuple(CAPABILITY),
                        help="with width and tiles: candidate tiles for this chip")
    parser.add_argument("width", nargs="?", type=int, help="padded head dim (64, 128, 256)")
    parser.add_argument("tiles", nargs="*", help="block_m,block_n,warps,stages")
    parser.add_argument("--out", default=None, help="folder for the JSON (default $OUT, else .)")
    args = parser.parse_args(argv)
    from tileattn.kernels.attention import bwd
    from tileattn.kernels.attention.fwd import TileConfig
    if args.arch:
        if args.width is None or not args.tiles:
            parser.error("give a width and at least one tile with the chip")
        jobs = [(args.arch, args.width, kernel, TileConfig(*map(int, t.split(","))))
                for t in args.tiles for kernel in ("dkdv", "dq")]
    else:
        jobs = [(name, width, kernel, table[(name, width)])
                for kernel, table in (("dkdv", bwd.DKDV_CONFIGS), ("dq", bwd.DQ_CONFIGS))
                for name, width in table if name != "cpu"]
    rows = []
    for job in jobs:
        rows.append(report(*job))
        print(rows[-1], flush=True)
    print(f"wrote {write_json('backward-registers', {'rows': rows}, args.out)}")


if __name__ == "__main__":
    main()
