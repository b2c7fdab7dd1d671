export PYTHONPATH=.
M=sm__inst_executed_pipe_xu.avg.pct_of_peak_sustained_active,sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active,smsp__issue_active.avg.pct_of_peak_sustained_active,sm__inst_executed.sum,gpu__time_duration.sum,sm__cycles_active.avg,dram__bytes_read.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,lts__t_sector_hit_rate.pct,sm__warps_active.avg.pct_of_peak_sustained_active
for C in 1 0; do
  CAUSAL=$C timeout 200 ncu --clock-control none --launch-skip 2 --launch-count 1 -k regex:attention_sm90 --metrics $M --section WarpStateStats --section SourceCounters --section SpeedOfLight -o $OUT/d1k$C python .ab/prof_dense1k.py > $OUT/ncu-d1k$C.txt 2>&1
  ncu --import $OUT/d1k$C.ncu-rep --print-details all > $OUT/ncu-d1k$C-details.txt 2>&1
  ncu --import $OUT/d1k$C.ncu-rep --page source --csv --print-source sass > $OUT/d1k$C-source.csv 2>&1
  echo "== CAUSAL=$C"; grep -E "pipe|issue_active|inst_executed|gpu__time|dram|lts__|warps_active|cycles_active|Duration|Throughput" $OUT/ncu-d1k$C-details.txt | head -24
  rm -f $OUT/d1k$C.ncu-rep
done
