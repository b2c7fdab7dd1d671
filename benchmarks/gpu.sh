#!/usr/bin/env bash
# The GPU session runner: one command per device call, running the steps named on its command
# line in order, from the repository root.
#
#   bash benchmarks/gpu.sh STEP[:ARG[:ARG...]] ...       e.g. bash benchmarks/gpu.sh tests prefill
#
# Steps (ARGs are passed on to the command, one word each):
#   tests        python -m pytest tests/gpu -n 14        the fast GPU tier (the default tier; ~2.6 min cold)
#   tests-full   python -m pytest tests/gpu --full -n 14 the full grid too (~5 min: run it alone)
#   sanitizer    compute-sanitizer memcheck of benchmarks/sanitizer_cases.py (ARGs: case families)
#   racecheck    the same under racecheck -> $OUT/racecheck.log and a summary by site
#                (racecheck_summary.py; e.g. racecheck:mla). It reports every mbarrier hand-off
#                between warpgroups as a hazard: read the sites, not the count.
#   prefill      python -m tileattn bench                -> $OUT/<gpu>/prefill.json and .png
#                (prefill-partial.json for part of the grid or of its peers; merge parts
#                with python -m tileattn bench --merge)
#   mla          python -m tileattn bench --mla          -> $OUT/<gpu>/mla.json
#   accuracy     python -m tileattn accuracy             -> $OUT/<gpu>/accuracy.json (FP8 scales rows too)
#   backward     python benchmarks/backward.py --quick   (~2 min)      -> <gpu>/backward-partial.json
#   serving      python benchmarks/serving.py --quick    (~2 min)      -> <gpu>/serving-partial.json
#   mods         python benchmarks/flex_mods.py --quick  (~1.5 min)    -> <gpu>/mods-partial.json
#   fp8          python benchmarks/fp8_prefill.py (~2.5 min)  -> $OUT/<gpu>/fp8.json (FP8 vs cuDNN FP8)
#   fp8-accuracy python benchmarks/fp8_scales_accuracy.py --device cuda (~1.5 min)
#                                                        -> <gpu>/accuracy-partial.json
#   backward-full, serving-full, mods-full   the full grid, or the part its ARGs name (e.g.
#                backward-full:--head-dims:64:128), -> <gpu>/<grid>.json when complete, else
#                <grid>-partial.json (merge parts with the script's --merge)
#   demo, info   python -m tileattn demo / info
#   ncu-prefill:D:COLUMN:N:CAUSAL[:--kernel:K]   Nsight Compute of one prefill launch
#   ncu-mla:HEADS:bf16|fp8[:--batch:B:--seq-len:S]   Nsight Compute of one MLA partial launch
#   py:SCRIPT[:ARG...]   python benchmarks/SCRIPT ARG... (its JSON lands in $OUT)
#
# Output goes to $OUT (the device tool returns what is there; ./gpu-session without it):
# session.log (everything printed), results files as <gpu>/<grid>.json (a partial grid as
# <grid>-partial.json), ncu reports, scripts' JSON. Copy a complete grid's file over
# benchmarks/results/<gpu>/<grid>.json to commit it. Peer wheels (FlashAttention-4,
# cudnn-frontend for the cuDNN FP8 peer) travel as benchmarks/peer_wheels.py lays them out, one
# .wheels-K folder a call (or a single wheel in .whl/); they are installed into /tmp/site, which
# goes on PYTHONPATH when it exists.
# STEP_TIMEOUT (seconds, default 600) bounds each step, so that a hang cannot eat the call.
# Grid steps (prefill, backward, serving, mods and their -full forms) start no new point once the call's
# budget is nearly spent: CALL_BUDGET_S (default 600, the device's limit a call) minus the time
# since gpu.sh started, minus 90 s for the last point and the results (an explicit
# :--budget-s:S wins). Each writes its partial file after every point, so a cut run keeps rows.
# Exit status: 0 when every step succeeded, 1 otherwise (the remaining steps still run); 3 when
# the device failed the timing gate (benchmarks/device_health.py, run once before the first step
# that times; HEALTH_FLOOR_TFLOPS=0 skips it): no step ran, give the machine back.

set -u -o pipefail
cd "$(dirname "$0")/.."

usage() {
  sed -n '2,/^$/p' "$0" | sed 's/^# \{0,1\}//'
}
if [ $# -eq 0 ] || [ "$1" = "-h" ] || [ "$1" = "--help" ]; then
  usage
  [ $# -eq 0 ] && exit 2 || exit 0
fi

export OUT=${OUT:-$PWD/gpu-session}
mkdir -p "$OUT"
LOG="$OUT/session.log"
PY=${PYTHON:-python3}
export PYTHONUNBUFFERED=1
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
# Peer wheels (benchmarks/peer_wheels.py): what a call carries in .wheels-K/ (and .whl/) is
# stashed in /tmp/wheels, which outlives the call while the machine stays warm; a split wheel is
# joined once all its parts are there, and the whole wheels are installed into /tmp/site.
mkdir -p /tmp/wheels
for dir in .whl .wheels-[0-9]*; do
  [ -d "$dir" ] && cp "$dir"/* /tmp/wheels/ 2>/dev/null
done
for count in /tmp/wheels/*.whl.parts; do
  [ -e "$count" ] || continue
  wheel=${count%.parts}
  parts=("$wheel".part-*)
  if [ ! -e "$wheel" ] && [ "${#parts[@]}" -eq "$(cat "$count")" ]; then
    cat "${parts[@]}" > "$wheel"
  fi
done
if compgen -G "/tmp/wheels/*.whl" > /dev/null; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site /tmp/wheels/*.whl 2>&1 | tail -3
fi
for dir in /tmp/site /tmp/site/nvidia_cutlass_dsl/dsl_packages; do
  [ -d "$dir" ] && PYTHONPATH=$PYTHONPATH:$dir
done

# Run a command with its output on stdout and appended to the session log; its exit status.
logged() {
  timeout "${STEP_TIMEOUT:-600}" "$@" 2>&1 | tee -a "$LOG"
  return "${PIPESTATUS[0]}"
}

NCU_PREFILL_METRICS=sm__inst_executed_pipe_xu.avg.pct_of_peak_sustained_active,sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active,sm__pipe_fma_cycles_active.avg.pct_of_peak_sustained_active,sm__pipe_alu_cycles_active.avg.pct_of_peak_sustained_active,sm__inst_executed_pipe_fp16.avg.pct_of_peak_sustained_active
NCU_MLA_METRICS=sm__pipe_alu_cycles_active.avg.pct_of_peak_sustained_active,sm__pipe_fma_cycles_active.avg.pct_of_peak_sustained_active,sm__inst_executed_pipe_lsu.avg.pct_of_peak_sustained_active,sm__inst_executed_pipe_xu.avg.pct_of_peak_sustained_active,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active,sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active,l1tex__data_pipe_lsu_wavefronts_mem_shared.avg.pct_of_peak_sustained_elapsed,smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio,smsp__average_warps_issue_stalled_short_scoreboard_per_issue_active.ratio,smsp__average_warps_issue_stalled_barrier_per_issue_active.ratio,smsp__average_warps_issue_stalled_mio_throttle_per_issue_active.ratio,smsp__average_warps_issue_stalled_wait_per_issue_active.ratio
NCU_SECTIONS=(--section SpeedOfLight --section ComputeWorkloadAnalysis --section Occupancy
              --section WarpStateStats --section SchedulerStats --section InstructionStats
              --section LaunchStats --section MemoryWorkloadAnalysis)
NCU_SUMMARY="Duration|Registers Per|Block Size|Grid Size|Achieved Occupancy|Issue Slots Busy|No Eligible|Warp Cycles Per Issued|pipe_|stalled|Throughput|L2 Hit|L1/TEX Hit|wavefronts"

# Seconds a grid may still start points in: the call's budget less what has run, less 90 s.
grid_budget() {
  local budget=$(( ${CALL_BUDGET_S:-600} - SECONDS - 90 ))
  [ $budget -lt 1 ] && budget=1
  echo $budget
}

# A grid script: benchmarks/SCRIPT with --out, the call's remaining budget and the step's ARGs.
grid_step() {
  local script=$1
  shift
  logged "$PY" "benchmarks/$script" --out "$OUT" --budget-s "$(grid_budget)" "$@"
}

# ncu of the third launch matching a kernel regex; the report goes to $OUT/NAME.txt.
profile() {
  local name=$1 regex=$2 metrics=$3
  shift 3
  timeout "${STEP_TIMEOUT:-600}" ncu --clock-control none --launch-skip 2 --launch-count 1 \
    -k "regex:$regex" "${NCU_SECTIONS[@]}" --metrics "$metrics" \
    "$PY" benchmarks/profile_shape.py "$@" > "$OUT/$name.txt" 2>&1
  local status=$?
  grep -E "$NCU_SUMMARY" "$OUT/$name.txt" | head -40 | tee -a "$LOG"
  return $status
}

{
  nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv
  "$PY" -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, 'cudnn', torch.backends.cudnn.version())"
} 2>&1 | tee -a "$LOG"

# The timing gate, once, before any step that times.
for step in "$@"; do
  case ${step%%:*} in
    prefill|mla|backward|serving|mods|backward-full|serving-full|mods-full|fp8|py)
      logged "$PY" benchmarks/device_health.py || exit 3
      break ;;
  esac
done

status=0
for step in "$@"; do
  IFS=: read -r -a parts <<< "$step"
  name=${parts[0]}
  args=("${parts[@]:1}")
  echo "=== $step $(date -u +%T)" | tee -a "$LOG"
  case $name in
    tests) logged "$PY" -m pytest -q -p no:cacheprovider -n 14 tests/gpu ${args[@]+"${args[@]}"} ;;
    tests-full) logged "$PY" -m pytest -q -p no:cacheprovider -n 14 tests/gpu --full \
                  ${args[@]+"${args[@]}"} ;;
    sanitizer) logged compute-sanitizer --tool memcheck --error-exitcode 9 \
                 "$PY" benchmarks/sanitizer_cases.py ${args[@]+"${args[@]}"} ;;
    racecheck) logged compute-sanitizer --tool racecheck --racecheck-report hazard \
                 --print-limit 1000000 --log-file "$OUT/racecheck.log" \
                 "$PY" benchmarks/sanitizer_cases.py ${args[@]+"${args[@]}"} &&
               logged "$PY" benchmarks/racecheck_summary.py "$OUT/racecheck.log" ;;
    prefill) logged "$PY" -m tileattn bench --out "$OUT" --budget-s "$(grid_budget)" \
               ${args[@]+"${args[@]}"} ;;
    mla) logged "$PY" -m tileattn bench --mla --out "$OUT" ${args[@]+"${args[@]}"} ;;
    accuracy) logged "$PY" -m tileattn accuracy --out "$OUT" ${args[@]+"${args[@]}"} ;;
    backward) grid_step backward.py --quick ${args[@]+"${args[@]}"} ;;
    serving) grid_step serving.py --quick ${args[@]+"${args[@]}"} ;;
    mods) grid_step flex_mods.py --quick ${args[@]+"${args[@]}"} ;;
    backward-full) grid_step backward.py ${args[@]+"${args[@]}"} ;;
    serving-full) grid_step serving.py ${args[@]+"${args[@]}"} ;;
    mods-full) grid_step flex_mods.py ${args[@]+"${args[@]}"} ;;
    fp8) logged "$PY" benchmarks/fp8_prefill.py --out "$OUT" ${args[@]+"${args[@]}"} ;;
    fp8-accuracy) logged "$PY" benchmarks/fp8_scales_accuracy.py --device cuda --out "$OUT" \
                    ${args[@]+"${args[@]}"} ;;
    demo|info) logged "$PY" -m tileattn "$name" ;;
    ncu-prefill) profile "ncu-prefill-$(IFS=-; echo "${args[*]}")" "attention|fmha|sdpa|cudnn|flash" \
                   "$NCU_PREFILL_METRICS" prefill ${args[@]+"${args[@]}"} ;;
    ncu-mla) profile "ncu-mla-$(IFS=-; echo "${args[*]}")" "mla_.*partial" \
               "$NCU_MLA_METRICS" mla ${args[@]+"${args[@]}"} ;;
    py) [ ${#args[@]} -gt 0 ] && logged "$PY" "benchmarks/${args[0]}" "${args[@]:1}" ;;
    *) echo "unknown step $name (bash benchmarks/gpu.sh --help)" | tee -a "$LOG"; false ;;
  esac
  result=$?
  if [ $result -ne 0 ]; then
    echo "=== $step failed (exit $result)" | tee -a "$LOG"
    status=1
  fi
done
echo "=== done $(date -u +%T)" | tee -a "$LOG"
exit $status
