"""Run the sm90 FP8 GPU tests with FP8_CONFIGS[128] taking wide steps (tail_n=64)."""
import dataclasses, sys
import pytest
from tileattn.kernels.attention import sm90
sm90.FP8_CONFIGS[128] = dataclasses.replace(sm90.FP8_CONFIGS[128], tail_n=64)
sys.exit(pytest.main(["-q", "-x", "-p", "no:cacheprovider", "tests/gpu/test_attention_sm90_fp8.py"] + sys.argv[1:]))
