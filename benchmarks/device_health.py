"""The timing gate `bash benchmarks/gpu.sh` runs before a step that times:
`python benchmarks/device_health.py [--floor TFLOPS]` reads a bf16 8192^3 matmul five times and
exits 3 when one reading falls under the floor (default 550 TFLOP/s, for the lent H100 and H200;
HEALTH_FLOOR_TFLOPS sets it for gpu.sh, 0 turns the gate off). On 2026-11-28 a lent H100 read
694 then 351 TFLOP/s within seconds and every timing of that call ran ~3.5x slow
(docs/design.md, "Benchmarks and results"): such a call's numbers are void, and a fresh machine
is the remedy (give it back)."""
import argparse
import os
import subprocess
import sys

FLOOR_TFLOPS = 550.0
SIZE = 8192


def verdict(readings: list, floor: float) -> str | None:
    """None when every reading is at or above the floor, else why the call's timings are void."""
    low = [round(r) for r in readings if r < floor]
    if floor <= 0 or not low:
        return None
    return (f"device unhealthy: bf16 matmul read {[round(r) for r in readings]} TFLOP/s, "
            f"{len(low)} under the floor of {floor:g}: timings would be void")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--floor", type=float,
                        default=float(os.environ.get("HEALTH_FLOOR_TFLOPS", FLOOR_TFLOPS)),
                        help="TFLOP/s every reading must reach (0: no gate)")
    args = parser.parse_args(argv)
    import torch
    from tileattn.bench.common import time_ms
    a = torch.randn(SIZE, SIZE, device="cuda", dtype=torch.bfloat16)
    readings = [2 * SIZE**3 / time_ms(lambda: a @ a) / 1e9 for _ in range(5)]
    clocks = subprocess.run(["nvidia-smi", "--query-gpu=clocks.sm,power.draw,temperature.gpu,"
                             "clocks_throttle_reasons.active", "--format=csv,noheader"],
                            capture_output=True, text=True).stdout.strip()
    print(f"health: bf16 matmul TFLOP/s {[round(r) for r in readings]} | {clocks}")
    why = verdict(readings, args.floor)
    if why:
        print(why, file=sys.stderr)
        return 3
    return 0


if __name__ == "__main__":
    sys.exit(main())
