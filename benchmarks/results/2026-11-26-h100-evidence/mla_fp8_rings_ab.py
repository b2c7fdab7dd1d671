"""A/B: FP8 MLA Gluon kernel ring depths (NUM_STAGES widened, RAW_STAGES e4m3) vs the bf16 cache,
graph replays, batch 768, page 64, q_len 1; two interleaved rounds."""
import json, math, os, sys
import torch, triton, tileattn
from tileattn.bench.mla import make_cache
from tileattn.kernels.mla import sm90_fp8
from tileattn.reference import mla_decode_reference
SCALE = 1 / math.sqrt(192)
VARIANTS = [tuple(int(x) for x in v.split("-")) for v in os.environ.get("VARIANTS", "3-2-1,3-2-3").split(",")]
heads_list = [int(x) for x in os.environ.get("HEADS", "16,64,128").split(",")]
seqs = [int(x) for x in os.environ.get("SEQS", "2048,8192").split(",")]
dev = torch.device("cuda"); batch = 768
rows = []
for seq in seqs:
    for heads in heads_list:
        gen = torch.Generator(device=dev).manual_seed(0)
        q = torch.randn(batch, 1, heads, 576, device=dev, generator=gen).to(torch.bfloat16)
        seq_lens = torch.full((batch,), seq, device=dev, dtype=torch.int32)
        result = {"seq": seq, "heads": heads}
        for kv_dtype in ("bf16", "fp8"):
            kv, table, descale = make_cache(batch, seq, 64, kv_dtype, dev, gen)
            plan = tileattn.mla_plan(seq_lens, num_heads=heads, page_size=64, kv_dtype=kv.dtype, device=dev)
            names = [("bf16", None)] if kv_dtype == "bf16" else [("fp8-" + "-".join(map(str, v)), v) for v in VARIANTS]
            for rnd in range(2):
                for name, v in names:
                    if v is not None:
                        sm90_fp8.NUM_STAGES, sm90_fp8.RAW_STAGES, sm90_fp8.FENCE_GROUPS = v
                    call = lambda: tileattn.mla_decode(q, kv, table, seq_lens, softmax_scale=SCALE,
                                                       kv_descale=descale, plan=plan, validate=False)
                    if rnd == 0:
                        out = call()
                        ref, _ = mla_decode_reference(q[:2], kv, table[:2], seq_lens[:2], softmax_scale=SCALE, kv_descale=descale)
                        result.setdefault(name, {})["rel_error"] = float((out[:2].double() - ref).norm() / ref.norm())
                    torch.cuda.synchronize()
                    ms = triton.testing.do_bench_cudagraph(call, rep=100)
                    result[name].setdefault("ms", []).append(round(ms, 4))
            del kv
            torch.cuda.empty_cache()
        bf = min(result["bf16"]["ms"])
        result["speedup_vs_bf16"] = {n: round(bf / min(result[n]["ms"]), 3) for n in result if n.startswith("fp8")}
        print(json.dumps(result), flush=True)
        rows.append(result)
sm90_fp8.NUM_STAGES, sm90_fp8.RAW_STAGES, sm90_fp8.FENCE_GROUPS = VARIANTS[0]
json.dump({"device": torch.cuda.get_device_name(), "rows": rows}, open(os.path.join(os.environ.get("OUT", "."), "mla-stages-ab.json"), "w"), indent=1)
