"""A/B on 2 ranks (torchrun): where the ring's time over its local kernels goes at L per rank.
bf16, H=32, D=128, causal. Writes $OUT/cp-ab.json."""
import json, os, sys, statistics
import torch, torch.distributed as dist
sys.path.insert(0, "benchmarks")
from context_parallel import timed_ms, gathered, random_shards  # noqa: E402
import tileattn  # noqa: E402
import tileattn.distributed as td  # noqa: E402
import tileattn.distributed.attention  # noqa: E402,F401
ring_mod = sys.modules["tileattn.distributed.attention"]
from tileattn.distributed.ring import Ring, merge_into  # noqa: E402
from tileattn.kernels.attention import sm90  # noqa: E402
from tileattn.ops import attention as attention_ops  # noqa: E402


def main():
    device = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
    torch.cuda.set_device(device)
    dist.init_process_group("nccl", device_id=device)
    group, rank, world = dist.group.WORLD, dist.get_rank(), dist.get_world_size()
    length = int(os.environ.get("AB_L", 32768))
    q, k, v, _ = random_shards(1000 + rank, length, 32, "bf16")
    ring = Ring(group, rank, world)
    sms = torch.cuda.get_device_properties(device).multi_processor_count
    rows = {"L": length, "W": world, "sms": sms}

    def med(fn):
        return statistics.median(gathered(timed_ms(fn, group), group))

    def kernel():
        tileattn.attention(q, k, v, causal=True, out_dtype=torch.float32, return_lse=True)

    def half_kernel():
        tileattn.attention(q, k[:, : length // 2], v[:, : length // 2], causal=False,
                           out_dtype=torch.float32, return_lse=True)

    def transfer():
        ring.pass_along([k, v], 0).wait()

    def under(fn):
        def run():
            flight = ring.pass_along([k, v], 0)
            fn()
            flight.wait()
        return run

    def ring_call():
        td.attention(q, k, v, group=group, causal=True)

    rows["transfer_ms"] = med(transfer)
    for reserve in (0, 8, 16, 32):
        sm90.num_sms = lambda device, n=reserve: sms - n
        attention_ops._CALLS.clear()
        rows[f"kernel_r{reserve}"] = med(kernel)
        rows[f"kernel_under_transfer_r{reserve}"] = med(under(kernel))
        rows[f"half_kernel_r{reserve}"] = med(half_kernel)
        rows[f"half_under_transfer_r{reserve}"] = med(under(half_kernel))
        rows[f"ring_r{reserve}"] = med(ring_call)
        if rank == 0:
            print(json.dumps(rows), flush=True)
    sm90.num_sms = lambda device: sms
    attention_ops._CALLS.clear()
    checked = ring_mod._check_collectively
    ring_mod._check_collectively = lambda *a, **kw: None
    rows["ring_unchecked"] = med(ring_call)
    ring_mod._check_collectively = checked
    out = torch.randn(1, length, 32, 128, device=device)
    lse = torch.randn(1, 32, length, device=device)
    block_out, block_lse = torch.randn_like(out), torch.randn_like(lse)
    rows["merge_full_ms"] = med(lambda: merge_into(out, lse, block_out, block_lse))
    rows["round_out_ms"] = med(lambda: out.to(torch.bfloat16))
    if rank == 0:
        print(json.dumps(rows), flush=True)
        with open(os.path.join(os.environ.get("OUT", "."), f"cp-ab-{length}.json"), "w") as f:
            json.dump(rows, f, indent=1)
    dist.destroy_process_group()


main()
