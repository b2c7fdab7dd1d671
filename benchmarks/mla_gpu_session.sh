#!/bin/bash
# One device-tool run for MLA decode: GPU tests, then the benchmark grid. Results under $OUT.
export PYTHONUNBUFFERED=1
pip install -e . --no-deps --no-build-isolation -q > /dev/null 2>&1 || export PYTHONPATH=.
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $OUT/gpu.txt
timeout ${TEST_TIMEOUT:-140} python -m pytest -q tests/gpu/test_mla_gpu.py 2>&1 | tail -30 | tee $OUT/gputests.log
timeout ${BENCH_TIMEOUT:-240} python -c "import tileattn.bench.mla as m; m.run(out_dir='$OUT', quick=${QUICK:-False}, budget_s=${BUDGET:-185})" 2>&1 | tee $OUT/bench.log | grep -v '^mla \[' 
