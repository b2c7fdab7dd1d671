"""Context-parallel causal attention, weak scaling: benchmarks/context_parallel.py times
tileattn.distributed.attention (zigzag ring) against the same work on one GPU and against
torch's context_parallel over SDPA, in one run. Run with torchrun on one host:

    NCCL_NVLS_ENABLE=0 torchrun --nproc-per-node 8 benchmarks/context_parallel.py

and it writes the `context` grid, `<gpu>/context.json` under --out (default $OUT, else
benchmarks/results in a checkout; docs/design.md, "Context parallelism").

Every context-parallel size W in --worlds (default: 2, 4, 8 up to the GPUs launched) runs at
once on the launched GPUs as world/W independent groups of W consecutive ranks (a dp x cp
device mesh), each rank holding L positions (--lengths, default 32k, 64k, 128k per GPU) of a
W·L sequence: batch 1, H heads (--heads, default 32), D = 128, causal, bf16 and FP8 e4m3
(per-tensor descales). With the defaults on 8 GPUs expect about 5 minutes; split a longer run
with --worlds / --lengths.

Times per rank (ms): each rank's own CUDA-event time of one call, median of 3 trials of n calls
(n the same on every rank, about a second per trial; not do_bench, whose call count varies by
rank and would deadlock a collective), after one warm-up call. The ring's time is the slowest
rank's.
  ring_ms          tileattn.distributed.attention on the rank's shards (its collective
                   argument check included).
  same_flops_ms    one single-GPU tileattn.attention call doing exactly one rank's share of
                   the causal work: the full W·L sequence with H/W heads. Causal attention over
                   S positions is S(S+1)/2 query-key pairs per head; one zigzag rank computes
                   L(L+1)/2 (its two chunks, causal) + (W-1)·L²/2 (half of each other block)
                   = L(W·L+1)/2 pairs per head, and (W·L)(W·L+1)/2 · H/W is the same number.
  local_calls_ms   the rank's own sequence of tileattn.attention calls (the ring's steps on
                   blocks of the same shapes) with no communication and no merge.
  local_merged_ms  the same with the ring's LSE merges and final rounding: ring_ms minus this
                   is the communication (and the argument check) that the ring does not hide.
  efficiency       = same_flops_ms / ring_ms: the fraction of one GPU's speed on the same
                   FLOPs that a rank keeps under context parallelism (1.0 is perfect).
  overlap          = local_calls_ms / ring_ms: how much of the communication and the LSE
                   merges the ring hides behind its kernels (1.0: all of it).
  torch_cp_ms      torch.distributed.tensor.experimental.context_parallel with
                   F.scaled_dot_product_attention under SDPBackend CUDNN_ATTENTION /
                   FLASH_ATTENTION (torch's flash kernel, or tileattn's in SDPA's flash slot:
                   torch_cp_tileattn_ms), bf16 only (torch's ring has no FP8), its default
                   head-tail (= zigzag) load balancing and all-gather K/V rotation
                   (--torch-rotate alltoall for its ring).
  single_gpu_ms    tileattn.attention at L positions with H heads on one GPU (the W=1 point).
  efficiency_vs_single = tflops_per_rank / single_gpu_tflops: weak scaling against one GPU's
                   speed at the per-rank length (its causal L(L+1)/2 pairs per head).
Correctness first: the ring's bf16 output is compared with torch's (same shards, same layout)
and its FP8 output with its bf16 output; the relative L2 differences are in each row.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh

import tileattn
import tileattn.distributed as td
from tileattn.bench.common import device_facts, spin_up, write_results
from tileattn.distributed.layout import block_task
from tileattn.distributed.ring import merge_into

GRID = "context"
HEAD_DIM = 128
TRIALS = 3


def parse_args(argv=None):
    parser = argparse.ArgumentParser(prog="torchrun ... benchmarks/context_parallel.py",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=None,
                        help="folder for <gpu>/context.json (default $OUT, else "
                             "benchmarks/results in a checkout)")
    parser.add_argument("--worlds", default=None, help="context-parallel sizes, e.g. 2,4,8")
    parser.add_argument("--lengths", default="32768,65536,131072", help="positions per GPU")
    parser.add_argument("--heads", type=int, default=32)
    parser.add_argument("--dtypes", default="bf16,fp8")
    parser.add_argument("--torch-backends", default="cudnn,flash,tileattn",
                        help="'' skips torch's CP")
    parser.add_argument("--backend", default="nccl",
                        help="the process group's backend; 'cpu:gloo,cuda:nccl' runs the ring's "
                             "argument check on the host (no GPU sync)")
    parser.add_argument("--torch-rotate", default="allgather", choices=("allgather", "alltoall"))
    return parser.parse_args(argv)


def timed_ms(fn, group=None) -> float:
    """Median per-call milliseconds of fn on this rank (module docstring). With a group, every
    rank of it runs the same number of calls, started together."""
    fn()
    torch.cuda.synchronize()
    start = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    estimate = torch.tensor([time.perf_counter() - start], device="cuda")
    if group is not None:
        dist.all_reduce(estimate, op=dist.ReduceOp.MAX, group=group)
    calls = max(1, min(50, int(1.0 / max(float(estimate), 1e-4))))
    trials = []
    for _ in range(TRIALS):
        if group is not None:
            dist.barrier(group=group)
        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        begin.record()
        for _ in range(calls):
            fn()
        end.record()
        end.synchronize()
        trials.append(begin.elapsed_time(end) / calls)
    return statistics.median(trials)


def gathered(value: float, group) -> list[float]:
    """value from every rank of group, in rank order."""
    mine = torch.tensor([value], dtype=torch.float64, device="cuda")
    parts = [torch.empty_like(mine) for _ in range(dist.get_world_size(group))]
    dist.all_gather(parts, mine, group=group)
    return [float(p) for p in parts]


def relative_difference(out, ref, group) -> float:
    """‖out − ref‖ / ‖ref‖ over the whole sequence (every rank's rows)."""
    sums = torch.stack([(out.double() - ref.double()).pow(2).sum(), ref.double().pow(2).sum()])
    dist.all_reduce(sums, group=group)
    return float((sums[0] / sums[1]).sqrt())


def random_shards(seed, length, heads, dtype):
    """(q, k, v, descales) [1, length, heads, D] on this GPU; FP8 quantized per tensor."""
    generator = torch.Generator(device="cuda").manual_seed(seed)
    q, k, v = (torch.randn(1, length, heads, HEAD_DIM, device="cuda", generator=generator,
                           dtype=torch.bfloat16) for _ in range(3))
    if dtype == "bf16":
        return q, k, v, {}
    (q, qd), (k, kd), (v, vd) = (tileattn.quantize_fp8(x) for x in (q, k, v))
    return q, k, v, dict(q_descale=qd, k_descale=kd, v_descale=vd)


def local_calls(q, k, v, descales, cp_rank, world, merged=False):
    """The ring's per-step tileattn.attention calls on local blocks of the same shapes; merged:
    with its LSE merges and final rounding too (the ring's work without communication)."""
    v = tileattn.prepare_v(v) if descales else v  # the ring makes FP8 V K-major once too

    def run():
        out = lse = None
        for step in range(world):
            task = block_task("zigzag", True, cp_rank, (cp_rank - step) % world, q.shape[1])
            if task is not None:
                block = tileattn.attention(q[:, task.q_rows], k[:, task.k_rows],
                                           v[:, task.k_rows], causal=task.causal,
                                           out_dtype=torch.float32, return_lse=True, **descales)
                if merged and out is None:
                    out, lse = block
                elif merged:
                    merge_into(out[:, task.q_rows], lse[:, :, task.q_rows], *block)
        if merged:
            out.to(torch.bfloat16)
    return run


def torch_context_parallel(cp_mesh, q, k, v, backend, seqlen, rotate):
    """(time in ms, local output [1, L, H, D]) of torch's context_parallel over SDPA."""
    from torch.distributed.tensor.experimental import context_parallel
    from torch.distributed.tensor.experimental._attention import set_rotate_method
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from tileattn.integrations import sdpa

    chosen = {"cudnn": SDPBackend.CUDNN_ATTENTION, "flash": SDPBackend.FLASH_ATTENTION,
              "tileattn": SDPBackend.FLASH_ATTENTION}[backend]
    q, k, v = (x.transpose(1, 2) for x in (q, k, v))  # SDPA's [B, H, L, D]
    # context_parallel picks its load balancer from its first buffer's length: a stand-in for
    # the sequence (W·L positions), sharded in place; q, k, v are already shards.
    positions = torch.arange(seqlen, device="cuda")[None]
    set_rotate_method(rotate)
    if backend == "tileattn":   # torch's ring, tileattn in SDPA's flash slot for each block
        sdpa.activate()
    try:
        with torch.no_grad(), sdpa_kernel([chosen]), context_parallel(
                cp_mesh, buffers=[positions], buffer_seq_dims=[1], no_restore_buffers={positions}):
            def call():
                return F.scaled_dot_product_attention(q, k, v, is_causal=True)
            out = call().transpose(1, 2)
            milliseconds = timed_ms(call, cp_mesh.get_group())
    finally:
        sdpa.restore()
    return milliseconds, out


def measure(args, world, length, dtype, mesh, rank, row):
    """Fill row with the ring, same-FLOPs and local-calls times (and torch's for bf16)."""
    group = mesh["cp"].get_group()
    cp_rank = dist.get_rank(group)
    heads = args.heads
    q, k, v, descales = random_shards(1000 + rank, length, heads, dtype)

    def ring():
        return td.attention(q, k, v, group=group, causal=True, **descales)

    out = ring()
    row["finite"] = bool(torch.isfinite(out).all())
    row["ring_ms_per_rank"] = gathered(timed_ms(ring, group), group)
    row["ring_ms"] = max(row["ring_ms_per_rank"])
    row["local_calls_ms"] = statistics.median(gathered(
        timed_ms(local_calls(q, k, v, descales, cp_rank, world)), group))
    row["local_merged_ms"] = statistics.median(gathered(
        timed_ms(local_calls(q, k, v, descales, cp_rank, world, merged=True)), group))
    pairs_per_head = length * (world * length + 1) // 2
    row["tflops_per_rank"] = 4 * HEAD_DIM * heads * pairs_per_head / row["ring_ms"] / 1e9
    if dtype == "bf16":
        RING_BF16[(world, length)] = out
        for backend in [b for b in args.torch_backends.split(",") if b]:
            key = f"torch_cp_{backend}_ms"
            try:
                milliseconds, torch_out = torch_context_parallel(
                    mesh["cp"], q, k, v, backend, world * length, args.torch_rotate)
                row[key] = max(gathered(milliseconds, group))
                row[f"vs_torch_cp_{backend}"] = relative_difference(out, torch_out, group)
            except Exception as error:  # noqa: BLE001 (recorded: a peer that cannot run)
                row[key] = None
                row[f"torch_cp_{backend}_error"] = f"{type(error).__name__}: {error}"[:300]
    elif (world, length) in RING_BF16:  # the same random values, quantized
        row["vs_bf16"] = relative_difference(out, RING_BF16.pop((world, length)), group)
    del q, k, v, out

    # One GPU, the same FLOPs: the whole W·L sequence with H/W heads.
    full = random_shards(2000 + rank, world * length, heads // world, dtype)
    row["same_flops_ms"] = statistics.median(gathered(timed_ms(
        lambda: tileattn.attention(*full[:3], causal=True, **full[3])), group))
    del full
    single = random_shards(3000 + rank, length, heads, dtype)
    row["single_gpu_ms"] = statistics.median(gathered(timed_ms(
        lambda: tileattn.attention(*single[:3], causal=True, **single[3])), group))
    row["single_gpu_tflops"] = 4 * HEAD_DIM * heads * (length * (length + 1) // 2) \
        / row["single_gpu_ms"] / 1e9
    row["efficiency"] = row["same_flops_ms"] / row["ring_ms"]
    row["efficiency_vs_single"] = row["tflops_per_rank"] / row["single_gpu_tflops"]
    row["overlap"] = row["local_calls_ms"] / row["ring_ms"]


RING_BF16: dict = {}


def main(argv=None) -> None:
    args = parse_args(argv)
    if os.environ.get("NCCL_NVLS_ENABLE") != "0":   # NVLink multicast stays off here
        raise SystemExit("run with NCCL_NVLS_ENABLE=0 in the environment (torchrun passes it on)")
    device = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
    torch.cuda.set_device(device)
    dist.init_process_group(args.backend, device_id=device)
    rank, world_size = dist.get_rank(), dist.get_world_size()
    worlds = ([int(w) for w in args.worlds.split(",")] if args.worlds
              else [w for w in (2, 4, 8) if w <= world_size and world_size % w == 0])
    lengths = [int(n) for n in args.lengths.split(",")]
    for world in worlds:
        if world_size % world or args.heads % world:
            raise SystemExit(f"W={world} must divide the {world_size} ranks and the {args.heads} heads")
    spin_up()
    rows = []
    for world in worlds:
        mesh = init_device_mesh("cuda", (world_size // world, world), mesh_dim_names=("dp", "cp"))
        for length in lengths:
            for dtype in args.dtypes.split(","):
                row = {"W": world, "positions_per_gpu": length, "seqlen": world * length,
                       "heads": args.heads, "head_dim": HEAD_DIM, "dtype": dtype, "causal": True}
                measure(args, world, length, dtype, mesh, rank, row)
                torch.cuda.empty_cache()
                rows.append(row)
                if rank == 0:
                    print(json.dumps(row), flush=True)
    if rank == 0:
        facts = device_facts()
        payload = {**facts, "ranks": world_size, "nccl": ".".join(map(str, torch.cuda.nccl.version())),
                   "NCCL_NVLS_ENABLE": os.environ.get("NCCL_NVLS_ENABLE"), "backend": args.backend,
                   "torch_rotate": args.torch_rotate, "definitions": __doc__, "rows": rows}
        path = write_results(GRID, payload, args.out or os.environ.get("OUT"))
        print(f"wrote {path}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
