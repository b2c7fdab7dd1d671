"""tileattn.flex_attention's gradients (ops/flex_backward.py) against fp64 autograd through the
user's own functions (tests/flex_backward_cases.py): causal, sliding window, document masks
with captured ids, prefix-LM, ALiBi, softcap and a captured relative-position table; GQA, one
K/V for every batch entry, Sq != Sk, odd lengths, rows that see no key, a gradient through lse
(with and without one through out), strided inputs, block lists that disagree with their
mask_mod; the backward reads only the blocks the BlockMask lists; untranslatable derivatives,
FP8 and captured tensors that require grad refused. Interpreter-sized shapes with 16- and
32-wide mask blocks. The GPU tier runs the same checks at real sizes
(tests/gpu/test_flex_gpu.py)."""

import pytest
import torch
from torch.nn.attention.flex_attention import BlockMask, create_block_mask

import tileattn
from tileattn.flex import emit_ops, translate

from .conftest import GRAD_TOLERANCES
from .flex_backward_cases import (NAMES, check_compiled_step, check_gradients, flex_case,
                                  reference)
from .flex_cases import case
from .flex_functions import alibi, softcap


@pytest.mark.parametrize("name", NAMES)
def test_gradients_equal_fp64_autograd(name):
    check_gradients(*flex_case(name))


@pytest.mark.parametrize("name", ["document_alibi", "non_square_no_full_blocks",
                                  "block_lists_only", "scale_and_lse"])
def test_forward_cases_differentiate(name):
    """tests/flex_cases.py's calls: (32, 16) mask blocks, lists without full blocks (and
    without transposed ones), random block lists whose partial blocks mask_mod filters, a
    scale and a where() score_mod."""
    arguments = case(name)
    if name == "non_square_no_full_blocks":      # and no transposed lists: tileattn makes them
        given = arguments["block_mask"]
        arguments["block_mask"] = BlockMask.from_kv_blocks(
            given.kv_num_blocks, given.kv_indices, BLOCK_SIZE=given.BLOCK_SIZE,
            mask_mod=given.mask_mod, seq_lengths=given.seq_lengths, compute_q_blocks=False)
        assert arguments["block_mask"].q_num_blocks is None
    inputs = [arguments[n].detach().requires_grad_() for n in ("query", "key", "value")]
    check_gradients(inputs, arguments.get("score_mod"), arguments["block_mask"],
                    scale=arguments.get("scale"))


def test_inside_torch_compile_forward_and_backward_equal_eager():
    check_compiled_step(*flex_case("alibi", heads=4))   # GQA: 4 query heads on 2


def test_gqa_shared_kv_odd_lengths_and_lse_gradient():
    """GQA (4 query heads on 2), one K/V for both batch entries (its gradient summed over
    them), Sq != Sk not multiples of the blocks, 32-wide mask blocks, a gradient through lse."""
    inputs, score_mod, block_mask = flex_case("document", torch.float16, seqlen_q=45,
                                              seqlen_k=77, heads=4, kv_heads=2, kv_batch=1,
                                              block=32)
    check_gradients(inputs, score_mod, block_mask, lse_grad=True)


def test_gradient_through_lse_alone_with_strided_inputs():
    """No gradient reaches out (the backward gets dout None); q and k are [B, S, H, D] buffers
    seen as [B, H, S, D]; (16, 32) mask blocks over Sq < Sk."""
    inputs, score_mod, block_mask = flex_case("prefix_lm", torch.float16, seqlen_q=40,
                                              seqlen_k=72, block=(16, 32))
    query, key, value = (x.detach().transpose(1, 2).contiguous().transpose(1, 2)
                         .requires_grad_() for x in inputs)
    _, lse = tileattn.flex_attention(query, key, value, block_mask=block_mask, return_lse=True)
    grad_lse = torch.randn(lse.shape, generator=torch.Generator().manual_seed(2))
    got = torch.autograd.grad(lse, (query, key), grad_lse)
    exact = [x.detach().double().requires_grad_() for x in (query, key, value)]
    want = torch.autograd.grad(reference(*exact, score_mod, block_mask)[1], exact[:2],
                               grad_lse.double())
    for name, g, w in zip("qk", got, want):
        error = float((g.double() - w).norm() / w.norm())
        assert error < GRAD_TOLERANCES[torch.float16], (name, error)


def test_backward_reads_only_listed_blocks():
    """Queries and keys of blocks the BlockMask never lists hold NaN: a backward that visited
    them (even masked) would multiply the NaN into dk (0 · NaN) or dq."""
    seqlen, hidden_from = 64, 48

    def mask_mod(b, h, q_idx, kv_idx):
        return (q_idx < hidden_from) & (kv_idx < hidden_from) & (kv_idx <= q_idx)
    block_mask = create_block_mask(mask_mod, 1, 1, seqlen, seqlen, device="cpu", BLOCK_SIZE=16)
    gen = torch.Generator().manual_seed(3)
    inputs = [torch.randn(1, 2, seqlen, 64, generator=gen).to(torch.bfloat16) for _ in range(3)]
    for x in inputs:
        x[:, :, hidden_from:] = float("nan")
    inputs = [x.requires_grad_() for x in inputs]
    out = tileattn.flex_attention(*inputs, block_mask=block_mask)
    grads = torch.autograd.grad(out, inputs, torch.ones_like(out))
    for name, grad in zip("qkv", grads):
        assert not grad.isnan().any(), name
        assert (grad[:, :, hidden_from:] == 0).all(), name


def test_untranslatable_derivative_is_named_only_when_a_gradient_is_needed(monkeypatch):
    """A score_mod whose derivative holds an op the emitter lacks (tanh_backward, removed here)
    runs forward; with inputs that require grad the error names the op."""
    monkeypatch.delattr(emit_ops.HookEmitter, "_op_tanh_backward")
    translate.clear_cache()
    try:
        inputs, _, block_mask = flex_case("causal")
        detached = [x.detach() for x in inputs]
        tileattn.flex_attention(*detached, score_mod=softcap(2.0), block_mask=block_mask)
        with pytest.raises(NotImplementedError, match=r"aten\.tanh_backward.*softcap_score"):
            tileattn.flex_attention(*inputs, score_mod=softcap(2.0), block_mask=block_mask)
    finally:
        translate.clear_cache()


def test_fp8_and_grad_requiring_captures_are_refused():
    inputs, _, block_mask = flex_case("causal")
    query = inputs[0].detach().float().to(torch.float8_e4m3fn)
    with pytest.raises(TypeError, match="query"):
        tileattn.flex_attention(query.requires_grad_(), query, query)
    slopes = torch.rand(2, requires_grad=True)
    with pytest.raises(ValueError, match="'slopes' of alibi_bias.*requires grad"):
        tileattn.flex_attention(*inputs, score_mod=alibi(slopes), block_mask=block_mask)
