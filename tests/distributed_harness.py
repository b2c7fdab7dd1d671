"""Run test cases in a group of spawned processes (CPU: gloo and the Triton interpreter; GPU:
NCCL), with bounded time: every collective times out, and the parent kills the group when its
deadline passes.

Only the standard library is imported at module level: a spawned CPU rank must set
TRITON_INTERPRET before anything imports triton, and the parent (which imports this module
too) must not have its environment changed.
"""

from __future__ import annotations

import multiprocessing
import os
import queue
import time
import traceback


def _rank_main(rank: int, world_size: int, store_path: str, case_names: list[str], results,
               collective_timeout_s: float, device: str) -> None:
    if device == "cpu":
        os.environ["TRITON_INTERPRET"] = "1"
        os.environ.setdefault("OMP_NUM_THREADS", "1")  # W ranks share the machine's cores
    else:
        os.environ["NCCL_NVLS_ENABLE"] = "0"  # NVLink multicast stays off on the lent machines
    import datetime

    import torch
    import torch.distributed as dist

    if device == "cpu":
        from tileattn import interpreter_fixes
        interpreter_fixes.apply()
        from tests import distributed_cases as cases
        torch.set_num_threads(1)
        backend = "gloo"
    else:
        from tests.gpu import distributed_gpu_cases as cases
        torch.cuda.set_device(rank)
        backend = "nccl"
    dist.init_process_group(backend, init_method=f"file://{store_path}", rank=rank,
                            world_size=world_size,
                            timeout=datetime.timedelta(seconds=collective_timeout_s))
    try:
        for name in case_names:
            started = time.perf_counter()
            try:
                note = cases.CASES[name](rank, world_size)
                outcome = ("ok", note or "")
            except BaseException:  # noqa: BLE001 (reported to the parent, which fails the test)
                outcome = ("failed", traceback.format_exc())
            results.put((rank, name, outcome, time.perf_counter() - started))
    finally:
        dist.destroy_process_group()


def run_group(world_size: int, case_names: list[str], store_path: str, deadline_s: float,
              collective_timeout_s: float = 120,
              device: str = "cpu") -> dict[str, list[tuple[str, str, float]]]:
    """{case: [(status, note or traceback, seconds) per rank]} after running the cases in
    order on `world_size` spawned ranks, whose collectives raise after waiting
    collective_timeout_s. device "cpu": gloo, the Triton interpreter, the cases of
    tests/distributed_cases.py; "cuda": NCCL, rank r on GPU r, tests/gpu/distributed_gpu_cases.py.
    Ranks that did not report a case by the deadline get ("timed out", ...) for it, and the
    group is killed."""
    context = multiprocessing.get_context("spawn")
    results = context.Queue()
    processes = [context.Process(target=_rank_main,
                                 args=(rank, world_size, store_path, case_names, results,
                                       collective_timeout_s, device),
                                 daemon=True)
                 for rank in range(world_size)]
    for process in processes:
        process.start()
    reports: dict[str, list] = {name: [None] * world_size for name in case_names}
    expected = world_size * len(case_names)
    received = 0
    end = time.monotonic() + deadline_s
    while received < expected and time.monotonic() < end:
        try:
            rank, name, outcome, seconds = results.get(timeout=1.0)
        except queue.Empty:
            if not any(p.is_alive() for p in processes):
                break  # every rank exited (a crash) without reporting the rest
            continue
        reports[name][rank] = (*outcome, seconds)
        received += 1
    for process in processes:
        process.join(timeout=max(1.0, end - time.monotonic()) if received == expected else 1.0)
        if process.is_alive():
            process.kill()
            process.join(timeout=5)
    for name, per_rank in reports.items():
        for rank, report in enumerate(per_rank):
            if report is None:
                per_rank[rank] = ("timed out", f"rank {rank} reported nothing for {name} within "
                                  f"{deadline_s} s (or crashed)", 0.0)
    return reports
