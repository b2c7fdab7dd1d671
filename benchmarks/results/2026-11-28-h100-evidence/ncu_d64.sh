set -u
export PYTHONPATH=.
n=d64-4096-bf16
timeout 240 ncu --clock-control none --launch-skip 2 --launch-count 1 -k "regex:attention_sm90" \
  --section SourceCounters --section WarpStateStats --section SpeedOfLight --section ComputeWorkloadAnalysis -f -o $OUT/$n \
  python benchmarks/profile_shape.py prefill 64 bf16 4096 0 > $OUT/$n.log 2>&1
echo "ncu rc $?"; tail -3 $OUT/$n.log
ncu -i $OUT/$n.ncu-rep --page source --csv --print-source sass > $OUT/$n-sass.csv 2>&1
ncu -i $OUT/$n.ncu-rep --page details > $OUT/$n-details.txt 2>&1
ls -la $OUT/
rm -f $OUT/$n.ncu-rep
