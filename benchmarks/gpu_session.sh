#!/usr/bin/env bash
# One device-tool call: the steps named on the command line, logs and results under $OUT.
#   bash benchmarks/gpu_session.sh tests gputests sanitizer sweep bench accuracy mlatests mla
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
# Optional wheels carried in .whl/ (e.g. nvidia-cudnn-frontend==1.14.1 for the cuDNN FP8 peer).
if compgen -G ".whl/*.whl" > /dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=$PWD:/tmp/site
fi
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv | tee "$OUT/gpu.txt"
python3 -c "import torch, triton; print(torch.__version__, triton.__version__, torch.backends.cudnn.version())"
for step in "$@"; do
  echo "=== $step $(date -u +%T)"
  case $step in
    tests) python3 -m pytest -q -x -p no:cacheprovider tests/test_attention.py tests/test_api_errors.py tests/test_arch.py tests/test_fp8.py 2>&1 | tee "$OUT/tests.log" | tail -15 ;;
    launchtests) python3 -m pytest -q -p no:cacheprovider tests/gpu/test_attention_gpu.py -k "cached_launch or cuda_graph or repeat_calls" 2>&1 | tee "$OUT/launchtests.log" | tail -5 ;;
    mlaprofile) for shape in $(echo "${MLA_PROFILE:-16:bf16,16:fp8}" | tr , ' '); do
        ncu --clock-control none --launch-skip 2 --launch-count 1 -k regex:mla_decode_partial \
          --section SpeedOfLight --section Occupancy --section WarpStateStats --section SchedulerStats \
          --section InstructionStats --section MemoryWorkloadAnalysis --section LaunchStats \
          --metrics sm__pipe_alu_cycles_active.avg.pct_of_peak_sustained_active,sm__pipe_fma_cycles_active.avg.pct_of_peak_sustained_active,sm__inst_executed_pipe_lsu.avg.pct_of_peak_sustained_active,sm__inst_executed_pipe_xu.avg.pct_of_peak_sustained_active,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active,sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active,l1tex__data_pipe_lsu_wavefronts_mem_shared.avg.pct_of_peak_sustained_elapsed,smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio,smsp__average_warps_issue_stalled_short_scoreboard_per_issue_active.ratio,smsp__average_warps_issue_stalled_barrier_per_issue_active.ratio,smsp__average_warps_issue_stalled_mio_throttle_per_issue_active.ratio,smsp__average_warps_issue_stalled_math_pipe_throttle_per_issue_active.ratio,smsp__average_warps_issue_stalled_wait_per_issue_active.ratio,smsp__average_warps_issue_stalled_lg_throttle_per_issue_active.ratio \
          python3 benchmarks/mla_profile.py ${shape//:/ } > "$OUT/ncu-mla-${shape//:/-}.txt" 2>&1
        grep -E "Duration|Throughput|Warp Cycles Per Issued|Issue Slots|Stall|Achieved Occupancy|Registers Per|Shared Memory Config|Block Limit|One or More|No Eligible|L1/TEX Hit|L2 Hit|pipe_|stalled|wavefronts" "$OUT/ncu-mla-${shape//:/-}.txt" | head -60
      done ;;
    prefillprofile) for shape in $(echo "${PREFILL_PROFILE:-128:fp8e4m3-vT:16384:0:portable}" | tr , ' '); do
        ncu --clock-control none --launch-skip 2 --launch-count 1 -k "regex:attention|fmha|sdpa|cudnn|flash" \
          --section SpeedOfLight --section ComputeWorkloadAnalysis --section Occupancy --section WarpStateStats \
          --section SchedulerStats --section InstructionStats --section LaunchStats --section MemoryWorkloadAnalysis \
          --metrics sm__inst_executed_pipe_xu.avg.pct_of_peak_sustained_active,sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active,sm__pipe_fma_cycles_active.avg.pct_of_peak_sustained_active,sm__pipe_alu_cycles_active.avg.pct_of_peak_sustained_active,sm__inst_executed_pipe_fp16.avg.pct_of_peak_sustained_active \
          python3 benchmarks/prefill_profile.py ${shape//:/ } > "$OUT/ncu-prefill-${shape//:/-}.txt" 2>&1
        echo "--- $shape"; grep -E "^  [a-zA-Z_]|Duration|Registers Per|Block Size|Grid Size|Shared Memory Config|Achieved Occupancy|Issue Slots Busy|Issued Warp|No Eligible|Warp Cycles Per Issued|pipe_|Compute \(SM\) Throughput|Memory Throughput|Theoretical Occ" "$OUT/ncu-prefill-${shape//:/-}.txt" | head -30
      done ;;
    sm90configs) python3 -c "
import json, os, pathlib
from tileattn.bench import sm90_sweep
raw = json.loads(os.environ['SM90_CANDIDATES'])   # {\"128,0\": [[block_n, stages, split], ...]}
cands = {(int(k.split(',')[0]), bool(int(k.split(',')[1]))): [tuple(c) for c in v] for k, v in raw.items()}
sm90_sweep.config_sweep(pathlib.Path('$OUT'), cands, contexts=(4096, 16384), causal_values=(False,))
" 2>&1 | tee "$OUT/sm90configs.log" | tail -30 ;;
    gputests) python3 -m pytest -q -p no:cacheprovider tests/gpu/test_attention_gpu.py 2>&1 | tee "$OUT/gputests.log" | tail -15 ;;
    sm90tests) python3 -m pytest -q -p no:cacheprovider tests/gpu/test_attention_sm90.py -k "${SM90_TESTS:-pingpong and not float8 and not True or dispatches}" 2>&1 | tee "$OUT/sm90tests.log" | tail -15 ;;
    causalab) python3 -c "from tileattn.bench import sweep; import json; r = sweep.causal_order_ab(); open('$OUT/causal-ab.json', 'w').write(json.dumps(r))" 2>&1 | tee "$OUT/causal-ab.log" | tail -30 ;;
    mlasweep) python3 -c "from tileattn.bench import mla; import json, os; a = json.loads(os.environ.get('MLA_SWEEP', '{}')); mla.sweep('$OUT', **{k: [tuple(x) for x in v] for k, v in a.items()})" 2>&1 | tee "$OUT/mla-sweep.log" | tail -90 ;;
    sweep) python3 -c "from tileattn.bench import sweep; import json; r = sweep.run(); open('$OUT/sweep.json', 'w').write(json.dumps(r))" 2>&1 | tee "$OUT/sweep.log" | grep -v "^$" | tail -12 ;;
    sweepcausal) python3 -c "from tileattn.bench import sweep; import json; r = sweep.run(head_dims=(64, 128), causal=True); open('$OUT/sweep-causal.json', 'w').write(json.dumps(r))" 2>&1 | tee "$OUT/sweep-causal.log" | grep best ;;
    sanitizer) compute-sanitizer --tool memcheck --error-exitcode 9 python3 -c "
import torch, tileattn
for dt in (torch.bfloat16, torch.float8_e4m3fn):
    q = torch.randn(2, 77, 4, 96, device='cuda'); k = torch.randn(2, 131, 2, 96, device='cuda'); v = torch.randn(2, 131, 2, 64, device='cuda')
    if dt.itemsize == 1:
        (q, qd), (k, kd), (v, vd) = (tileattn.quantize_fp8(x, dt) for x in (q, k, v)); d = dict(q_descale=qd, k_descale=kd, v_descale=vd)
    else:
        q, k, v = (x.to(dt) for x in (q, k, v)); d = {}
    for causal in (False, True):
        tileattn.attention(q, k, v, causal=causal, return_lse=True, **d)
for heads, q_len, kv_dtype in ((16, 1, torch.bfloat16), (16, 2, torch.bfloat16), (64, 1, torch.bfloat16),
                              (16, 2, torch.float8_e4m3fn), (64, 1, torch.float8_e4m3fn)):
    lens = torch.tensor([1, 70, 300], dtype=torch.int32, device='cuda'); page = 16
    kv = torch.randn(80, page, 576, device='cuda', dtype=torch.bfloat16).to(kv_dtype)
    table = torch.randperm(80, device='cuda').to(torch.int32)[:60].reshape(3, 20)
    q = torch.randn(3, q_len, heads, 576, device='cuda', dtype=torch.bfloat16)
    tileattn.mla_decode(q, kv, table, lens.clamp(min=q_len), softmax_scale=0.07)
import os; os.environ['TILEATTN_MLA_KERNEL'] = 'gluon'
for heads, q_len, kv_dtype in ((64, 1, torch.bfloat16), (128, 2, torch.bfloat16),
                              (64, 1, torch.float8_e4m3fn), (128, 2, torch.float8_e4m3fn)):  # page 64: the Gluon MLA kernels
    lens = torch.tensor([2, 70, 700], dtype=torch.int32, device='cuda'); page = 64
    kv = torch.randn(40, page, 576, device='cuda', dtype=torch.bfloat16).to(kv_dtype)
    table = torch.randperm(40, device='cuda').to(torch.int32)[:36].reshape(3, 12)
    q = torch.randn(3, q_len, heads, 576, device='cuda', dtype=torch.bfloat16)
    tileattn.mla_decode(q, kv, table, lens, softmax_scale=0.07)
os.environ['TILEATTN_KERNEL'] = 'sm90'  # the Gluon prefill kernel, odd lengths
q = torch.randn(2, 333, 8, 128, device='cuda', dtype=torch.bfloat16); k = torch.randn(2, 1001, 2, 128, device='cuda', dtype=torch.bfloat16)
for causal in (False, True):
    tileattn.attention(q, k, k, causal=causal, return_lse=True)
torch.cuda.synchronize(); print('sanitizer case ran')
" 2>&1 | tee "$OUT/sanitizer.log" | tail -5; echo "sanitizer exit ${PIPESTATUS[0]}" | tee -a "$OUT/sanitizer.log" ;;
    bench) python3 -m tileattn bench --out "$OUT" 2>&1 | tee "$OUT/bench.log" | grep -v "^prefill \[" | tail -80 ;;
    gridbench) python3 -m tileattn bench ${BENCH_ARGS:-} --out "$OUT" 2>&1 | tee "$OUT/gridbench.log" | grep -v "^prefill \\[" | tail -60 ;;
    quickbench) python3 -m tileattn bench --quick --out "$OUT" 2>&1 | tail -30 ;;
    shortbench) python3 -m tileattn bench --head-dims 64 128 --contexts 1024 2048 4096 --out "$OUT" 2>&1 | grep -v "^prefill \\[" | tail -40 ;;
    accuracy) python3 -m tileattn accuracy --out "$OUT" 2>&1 | tail -40 ;;
    # Session 8's Gluon changes, none GPU-run yet: FP8 key loop carrying S, padded (96/192) and
    # Dv != D head dims; and the grouped V key order. GPU tests first, each bounded (a barrier
    # bug would hang, not fail), then the A/B.
    fp8sm90) timeout 420 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_attention_sm90.py -k "float8 or grouped or padded" 2>&1 | tee "$OUT/fp8-sm90-tests.log" | tail -8
        timeout 240 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_attention_gpu.py -k "grouped or repeat" 2>&1 | tee "$OUT/fp8-grouped-tests.log" | tail -5
        timeout 420 python3 benchmarks/fp8_v_keys_ab.py 2>&1 | tee "$OUT/fp8-v-keys-ab.log" | tail -25 ;;
    headdimsab) timeout 360 python3 benchmarks/head_dims_ab.py "$OUT" 2>&1 | tee "$OUT/head-dims-ab.log" | tail -26 ;;
    mlatests) python3 -m pytest -q -p no:cacheprovider tests/gpu/test_mla_gpu.py 2>&1 | tee "$OUT/mla-gputests.log" | tail -15 ;;
    mla) python3 -m tileattn bench --mla --out "$OUT" 2>&1 | tee "$OUT/mla.log" | tail -60 ;;
    demo) python3 -m tileattn demo 2>&1 | tail -8 ;;
    overhead) python3 -c "from tileattn.bench import overhead; import json; r = overhead.run(); open('$OUT/overhead.json', 'w').write(json.dumps(r))" 2>&1 | tail -30 ;;
    *) echo "unknown step $step" ;;
  esac
done
echo "=== done $(date -u +%T)"
