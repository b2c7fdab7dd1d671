set -u
export PYTHONPATH=.
for spec in "128 bf16" "64 fp8" "64 bf16"; do
  set -- $spec
  timeout 200 ncu --clock-control none --launch-skip 2 --launch-count 1 -k "regex:mla_sm90.*partial" \
    --section SourceCounters --section WarpStateStats --section SpeedOfLight -f -o $OUT/mla-$1-$2 \
    python benchmarks/profile_shape.py mla $1 $2 --batch 768 --seq-len 2048 > $OUT/mla-$1-$2.log 2>&1
  echo "ncu $spec rc $?"; tail -2 $OUT/mla-$1-$2.log
  ncu -i $OUT/mla-$1-$2.ncu-rep --page source --csv --print-source sass > $OUT/mla-$1-$2-sass.csv 2>&1
  ncu -i $OUT/mla-$1-$2.ncu-rep --page details > $OUT/mla-$1-$2-details.txt 2>&1
  ls -la $OUT/mla-$1-$2-sass.csv
  rm -f $OUT/mla-$1-$2.ncu-rep
done
