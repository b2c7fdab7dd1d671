"""tileattn.flex_attention end to end on the real forward kernel (in the interpreter on the CPU):
results against torch's eager flex_attention in fp32 on the same inputs, and the kernel entry
point against the fp64 stand-in that documents its contract (tests/flex_reference.py), with
poisoned outputs so that unwritten elements are caught."""

import pytest
import torch

from tileattn.flex import flex_attention
from tileattn.flex.block_mask import block_mask_tensors
from tileattn.flex.translate import translate_mods
from tileattn.ops import flex as flex_op

from .conftest import LSE_TOLERANCES, TOLERANCES
from .flex_cases import CASES, case, check_against_torch
from .flex_reference import reference_attention_with_mods

pytestmark = [
    pytest.mark.filterwarnings("ignore:.*encountered in:RuntimeWarning"),
    # CPU tensors in the interpreter; tests/gpu/test_flex_gpu.py runs these cases on a GPU.
    pytest.mark.skipif(torch.cuda.is_available(), reason="the interpreter's run of the cases"),
]


@pytest.fixture(autouse=True)
def _hook_files_in_tmp(tmp_path, monkeypatch):
    monkeypatch.setenv("TILEATTN_CACHE_DIR", str(tmp_path))


@pytest.mark.parametrize("name", CASES)
def test_matches_torch_flex_attention(name):
    check_against_torch(flex_attention, case(name), TOLERANCES, LSE_TOLERANCES)


@pytest.mark.parametrize("dtype", [torch.float16, torch.float8_e4m3fn, torch.float8_e5m2],
                         ids=str)
@pytest.mark.parametrize("name", ["document_alibi", "block_lists_only", "causal_linear_alibi"])
def test_other_dtypes_match_torch(name, dtype):
    check_against_torch(flex_attention, case(name, dtype=dtype), TOLERANCES, LSE_TOLERANCES)


@pytest.mark.parametrize("name", ["sliding_window_softcap", "block_lists_only", "gqa_causal"])
def test_kernel_writes_what_the_contract_says(name):
    """attention_with_mods itself, on NaN-poisoned out/lse, against the fp64 stand-in."""
    arguments = case(name)
    query, key, value = (arguments[n].transpose(1, 2) for n in ("query", "key", "value"))
    batch, seqlen_q, num_q_heads, _ = query.shape
    hooks = translate_mods(arguments.get("score_mod"), arguments["block_mask"].mask_mod,
                           device=query.device)
    lists = block_mask_tensors(arguments["block_mask"], batch=batch, num_q_heads=num_q_heads,
                               seqlen_q=seqlen_q, seqlen_k=key.shape[1], device=query.device)
    results = []
    for entry_point in (flex_op.attention_with_mods, reference_attention_with_mods):
        out = torch.full((batch, num_q_heads, seqlen_q, value.shape[3]), float("nan"),
                         dtype=query.dtype).transpose(1, 2)
        lse = torch.full((batch, num_q_heads, seqlen_q), float("nan"))
        entry_point(query, key, value, out, lse, softmax_scale=0.125,
                    score_mod=hooks.score_mod, mask_mod=hooks.mask_mod, mod_args=hooks.mod_args,
                    block_mask_tensors=lists, q_descale=None, k_descale=None, v_descale=None)
        results.append((out.double(), lse.double()))
    (out, lse), (want_out, want_lse) = results
    assert not out.isnan().any() and not lse.isnan().any()
    error = (out - want_out).norm() / want_out.norm()
    assert error <= TOLERANCES[query.dtype], float(error)
    dead = torch.isneginf(want_lse)
    assert torch.equal(torch.isneginf(lse), dead)
    assert ((lse - want_lse).abs()[~dead] / want_lse.abs()[~dead].clamp(min=1)).max() \
        <= LSE_TOLERANCES[query.dtype]
