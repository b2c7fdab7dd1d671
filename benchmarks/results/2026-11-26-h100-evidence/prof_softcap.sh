export PYTHONPATH=.
M=sm__inst_executed_pipe_xu.avg.pct_of_peak_sustained_active,sm__pipe_fma_cycles_active.avg.pct_of_peak_sustained_active,sm__pipe_alu_cycles_active.avg.pct_of_peak_sustained_active,sm__pipe_fmaheavy_cycles_active.avg.pct_of_peak_sustained_active,sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active,smsp__issue_active.avg.pct_of_peak_sustained_active,sm__inst_executed_pipe_xu.sum,sm__inst_executed.sum,gpu__time_duration.sum,smsp__inst_executed_op_mufu.sum
for CAP in 0 30; do
  CAP=$CAP timeout 200 ncu --clock-control none --launch-skip 2 --launch-count 1 -k regex:attention_sm90 --metrics $M --section WarpStateStats --section SourceCounters -o $OUT/sc$CAP python .ab/prof_softcap.py > $OUT/ncu-sc$CAP.txt 2>&1
  ncu --import $OUT/sc$CAP.ncu-rep --print-details all > $OUT/ncu-sc$CAP-details.txt 2>&1
  ncu --import $OUT/sc$CAP.ncu-rep --page source --csv --print-source sass > $OUT/sc$CAP-source.csv 2>&1
  echo "== CAP=$CAP"; grep -E "pipe|issue_active|inst_executed|gpu__time|mufu|Stall|Warp Cycles" $OUT/ncu-sc$CAP-details.txt | head -40
  rm -f $OUT/sc$CAP.ncu-rep
done
ls -la $OUT
