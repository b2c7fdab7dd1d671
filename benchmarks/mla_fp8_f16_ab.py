"""A/B: the Gluon FP8 MLA kernel with bf16 q run on
fp16 MMAs (kernels/mla/sm90_fp8.Q_IN_F16: q scaled per row by a power of two into fp16,
e4m3 widened by one conversion per two values) against the bf16 widening by integer ops, and
the bf16 cache, in one process. Batch 768, seq 2048 and 8192, page 64, q_len 1; CUDA-graph
replays (the MLA grid's ms_graph) of tileattn.mla_decode with a plan made outside; the q
conversion is inside the timed call (a separate torch pass in this prototype). Accuracy: the
first two sequences against the fp64 reference.

    python benchmarks/mla_fp8_f16_ab.py [--heads 16 32 64 128] [--seq 2048 8192]
"""
import argparse, json, math, os
import torch, triton
import tileattn
from tileattn.bench.mla import make_cache
from tileattn.kernels.mla import sm90_fp8
from tileattn.reference import mla_decode_reference

SCALE = 1 / math.sqrt(192)


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python benchmarks/mla_fp8_f16_ab.py")
    parser.add_argument("--heads", type=int, nargs="+", default=[16, 32, 64, 128])
    parser.add_argument("--seq", type=int, nargs="+", default=[2048, 8192])
    parser.add_argument("--batch", type=int, default=768)
    args = parser.parse_args(argv)
    dev = torch.device("cuda")
    rows = []
    for seq in args.seq:
        for heads in args.heads:
            gen = torch.Generator(device=dev).manual_seed(0)
            q = torch.randn(args.batch, 1, heads, 576, device=dev, generator=gen).to(torch.bfloat16)
            seq_lens = torch.full((args.batch,), seq, device=dev, dtype=torch.int32)
            result = {"seq": seq, "heads": heads}
            for kv_dtype in ("bf16", "fp8"):
                kv, table, descale = make_cache(args.batch, seq, 64, kv_dtype, dev, gen)
                plan = tileattn.mla_plan(seq_lens, num_heads=heads, page_size=64,
                                         kv_dtype=kv.dtype, device=dev)
                variants = ("bf16",) if kv_dtype == "bf16" else ("fp8-bf16widen", "fp8-f16mma")
                for name in variants:
                    sm90_fp8.Q_IN_F16 = name == "fp8-f16mma"
                    call = lambda: tileattn.mla_decode(q, kv, table, seq_lens, softmax_scale=SCALE,
                                                       kv_descale=descale, plan=plan, validate=False)
                    out = call()
                    ref, _ = mla_decode_reference(q[:2], kv, table[:2], seq_lens[:2],
                                                  softmax_scale=SCALE, kv_descale=descale)
                    error = float((out[:2].double() - ref).norm() / ref.norm())
                    torch.cuda.synchronize()
                    ms = triton.testing.do_bench_cudagraph(call, rep=100)
                    result[name] = {"ms": round(ms, 4), "rel_error": error}
                del kv
                torch.cuda.empty_cache()
            result["f16mma_vs_bf16widen"] = round(result["fp8-bf16widen"]["ms"] / result["fp8-f16mma"]["ms"], 3)
            result["f16mma_vs_bf16_cache"] = round(result["bf16"]["ms"] / result["fp8-f16mma"]["ms"], 3)
            print(json.dumps(result), flush=True)
            rows.append(result)
    with open(os.path.join(os.environ.get("OUT", "."), "mla-fp8-f16-ab.json"), "w") as f:
        json.dump({"device": torch.cuda.get_device_name(), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
