"""Registers, spills and shared memory of the backward kernels' config rows, without a GPU.

Cross-compiles the default dK/dV kernel (atomic dQ) and the deterministic dQ kernel of every
row of kernels/attention_bwd.py's tables (or of the candidate tiles given) for its chip, and
runs Triton's ptxas -v on the PTX: the evidence behind the tables' "no spills" rule. Needs
TRITON_INTERPRET unset. Slow where a tile spills heavily (ptxas takes minutes then).

    python benchmarks/backward_registers.py                    # every table row
    python benchmarks/backward_registers.py sm90 128 16,128,8,2 32,64,8,2
"""

from __future__ import annotations

import re
import subprocess
import sys
import tempfile

import torch
from triton.backends.nvidia.compiler import get_ptxas

from tileattn.arch import arch_for_capability
from tileattn.kernels.attention import bwd as attention_bwd
from tileattn.kernels.attention_fwd import TileConfig
from tileattn.kernels.compile import cross_compile

CAPABILITY = {"sm80": (8, 0), "sm89": (8, 9), "sm90": (9, 0)}


def report(name: str, width: int, kernel: str, tiles: TileConfig) -> dict:
    """Compile one (chip, padded head dim, kernel, tiles) causal bf16 launch; ptxas's report."""
    major, minor = CAPABILITY[name]
    arch = arch_for_capability((major, minor))
    q = torch.empty(2, 256, 4, width, dtype=torch.bfloat16)
    k = torch.empty(2, 256, 2, width, dtype=torch.bfloat16)
    lse = torch.empty(2, 4, 256)
    deterministic = kernel == "dq"
    delta, dq_accum = attention_bwd.backward_workspace(q, lse, deterministic)
    launches = attention_bwd.backward_launches(
        q, k, k, q, lse, q, q, k, k, delta, dq_accum, causal=True, softmax_scale=0.1,
        window_left=-1, window_right=-1, arch=arch, **{f"{kernel}_tiles": tiles})
    compiled = cross_compile(launches[1] if kernel == "dkdv" else launches[2], major * 10 + minor)
    with tempfile.NamedTemporaryFile("w", suffix=".ptx") as ptx:
        ptx.write(compiled.ptx)
        ptx.flush()
        gpu = f"sm_{major}{minor}" + ("a" if major == 9 else "")
        log = subprocess.run([get_ptxas(major * 10 + minor).path, "-v", f"--gpu-name={gpu}",
                              ptx.name, "-o", "/dev/null"], capture_output=True, text=True).stderr
    return {"arch": name, "width": width, "kernel": kernel, "tiles": tuple(tiles.__dict__.values()),
            "shared": compiled.shared_bytes, "fits": compiled.shared_bytes <= arch.shared_memory_bytes,
            "registers": int(re.search(r"Used (\d+) registers", log).group(1)),
            "spill_bytes": int(re.search(r"(\d+) bytes spill stores", log).group(1))}


def main(argv: list[str]) -> None:
    if argv:
        name, width, *tiles = argv
        jobs = [(name, int(width), kernel, TileConfig(*map(int, t.split(","))))
                for t in tiles for kernel in ("dkdv", "dq")]
    else:
        jobs = [(name, width, kernel, table[(name, width)])
                for kernel, table in (("dkdv", attention_bwd.DKDV_CONFIGS),
                                      ("dq", attention_bwd.DQ_CONFIGS))
                for name, width in table if name != "cpu"]
    for job in jobs:
        print(report(*job), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
