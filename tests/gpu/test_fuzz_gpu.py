"""tests/test_fuzz.py's random sweeps on the GPU (fast tier): the compiled kernels on random
valid calls against the fp64 reference, and the corruption sweeps, which on CUDA tensors also
reach the checks that read index values on the device. Fewer valid seeds than on the CPU: each
new combination of dtype, head dims and masks compiles a kernel."""

import pytest
import torch

from .. import test_fuzz as fuzz

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@pytest.mark.parametrize("seed", range(12))
def test_random_dense_calls(seed):
    fuzz.check_dense(seed)


@pytest.mark.parametrize("seed", range(12))
def test_random_varlen_calls(seed):
    fuzz.check_varlen(1000 + seed)


@pytest.mark.parametrize("seed", range(6))
def test_random_mla_calls(seed):
    fuzz.check_mla(4000 + seed)


@pytest.mark.parametrize("function", ["attention", "attention_varlen"])
def test_random_corruptions(function):
    fuzz.test_random_corruptions_raise_named_errors(function)


def test_random_mla_corruptions():
    fuzz.test_random_mla_corruptions_raise_named_errors()


def test_invalid_page_ids():
    fuzz.test_invalid_page_ids_are_named_not_read()
