"""tileattn.flex_attention on a real GPU: the CPU cases at longer sequences, and torch's default
128-wide mask blocks at real sizes, against torch's eager flex_attention in fp32; gradients
against fp64 autograd (tests/flex_backward_cases.py). Skipped without CUDA."""

import pytest
import torch
from torch.nn.attention.flex_attention import create_block_mask

from tileattn.flex import flex_attention
from tileattn.flex.translate import cache_info, translate_mods
from tileattn.ops import flex as flex_op

from ..conftest import LSE_TOLERANCES, TOLERANCES
from ..flex_backward_cases import NAMES as BACKWARD_NAMES
from ..flex_backward_cases import check_compiled_step, check_gradients, flex_case
from ..flex_cases import CASES, case, check_against_torch
from ..flex_functions import alibi, causal, doc_ids_for, document, sliding_window, softcap

pytestmark = [
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

DTYPES = [torch.bfloat16, torch.float16, torch.float8_e4m3fn]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("name", CASES)
def test_cases_at_longer_sequences(name, dtype):
    check_against_torch(flex_attention, case(name, dtype=dtype, device="cuda", scale_up=9),
                        TOLERANCES, LSE_TOLERANCES)


def _real_size_case(kind, dtype, seqlen=1000, batch=2, heads=8):
    gen = torch.Generator(device="cuda").manual_seed(seqlen + len(kind))
    tensors = [torch.randn(batch, heads, seqlen, 128, device="cuda", generator=gen)
               for _ in range(3)]
    descales = {}
    if dtype.itemsize == 1:
        quantized = []
        for name, t in zip(("q", "k", "v"), tensors):
            scale = torch.finfo(dtype).max / t.abs().amax()
            quantized.append((t * scale).to(dtype))
            descales[f"{name}_descale"] = (1.0 / scale).float()
        tensors = quantized
    else:
        tensors = [t.to(dtype) for t in tensors]
    masks = {"causal": causal, "sliding_window": sliding_window(256),
             "document": document(doc_ids_for(batch, seqlen, 5).cuda())}
    score_mods = {"causal": softcap(30.0), "sliding_window": None,
                  "document": alibi(torch.rand(heads, device="cuda"))}
    block_mask = create_block_mask(masks[kind], batch if kind == "document" else 1, 1, seqlen,
                                   seqlen, device="cuda")           # torch's 128x128 blocks
    query, key, value = tensors
    return dict(query=query, key=key, value=value, block_mask=block_mask,
                score_mod=score_mods[kind], **descales)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("kind", ["causal", "sliding_window", "document"])
def test_default_block_size_at_real_sizes(kind, dtype):
    check_against_torch(flex_attention, _real_size_case(kind, dtype), TOLERANCES, LSE_TOLERANCES)


def test_repeat_calls_do_not_translate_again():
    arguments = _real_size_case("document", torch.bfloat16)
    flex_attention(**arguments)
    traces = cache_info()["traces"]
    arguments["block_mask"] = create_block_mask(document(doc_ids_for(2, 1000, 7).cuda()), 2, 1,
                                                1000, 1000, device="cuda")
    flex_attention(**arguments)
    assert cache_info()["traces"] == traces
    hooks = translate_mods(arguments["score_mod"], arguments["block_mask"].mask_mod,
                           device=torch.device("cuda"))
    assert all(t.is_cuda for t in hooks.mod_args)


@pytest.mark.parametrize("name", BACKWARD_NAMES)
def test_gradients_at_real_sizes(name):
    """The CPU backward checks (tests/test_flex_backward.py) at 1000 tokens, torch's 128-wide
    mask blocks, D=128, against fp64 autograd on the GPU."""
    check_gradients(*flex_case(name, seqlen_q=1000, seqlen_k=1000, heads=4, block=128,
                               head_dim=128, device="cuda"))


def test_inside_torch_compile_at_real_sizes():
    check_compiled_step(*flex_case("document", seqlen_q=1000, seqlen_k=1000, heads=4, block=128,
                                   head_dim=128, device="cuda"))


@pytest.mark.parametrize("name", ["causal", "document", "sliding_window", "relative_position"])
def test_gradients_at_2048_tokens_d64_fp16(name):
    check_gradients(*flex_case(name, torch.float16, seqlen_q=2048, seqlen_k=2048, heads=4,
                               block=128, head_dim=64, device="cuda"))


@pytest.mark.parametrize("block", [(128, 64), (64, 128), 256], ids=str)
def test_gradients_tiles_shrink_to_the_mask_blocks(block):
    """Mask blocks narrower (or wider) than the backward's tiles: the dK/dV and dQ tiles
    shrink to divide them, or walk a wide block in several steps."""
    check_gradients(*flex_case("alibi", seqlen_q=1500, seqlen_k=1100, heads=4, block=block,
                               head_dim=128, device="cuda"))


def test_gradients_gqa_shared_kv_and_lse_at_real_sizes():
    check_gradients(*flex_case("document", torch.float16, seqlen_q=777, seqlen_k=1500, heads=8,
                               kv_heads=2, kv_batch=1, block=128, head_dim=64, device="cuda"),
                    lse_grad=True)


@pytest.mark.parametrize("name", ["document_alibi", "non_square_no_full_blocks",
                                  "block_lists_only", "scale_and_lse"])
def test_forward_cases_differentiate_at_longer_sequences(name):
    """tests/flex_cases.py's calls, 16- and 32-wide mask blocks, 405 tokens."""
    arguments = case(name, device="cuda", scale_up=9)
    inputs = [arguments[n].detach().requires_grad_() for n in ("query", "key", "value")]
    check_gradients(inputs, arguments.get("score_mod"), arguments["block_mask"],
                    scale=arguments.get("scale"))


def test_backward_reads_only_listed_blocks_at_real_sizes():
    """Queries and keys the BlockMask never lists hold NaN; their gradients stay 0 and no NaN
    reaches the others (tests/test_flex_backward.py's check at 1024 tokens, 128 blocks)."""
    seqlen, hidden_from = 1024, 768

    def mask_mod(b, h, q_idx, kv_idx):
        return (q_idx < hidden_from) & (kv_idx < hidden_from) & (kv_idx <= q_idx)
    block_mask = create_block_mask(mask_mod, 1, 1, seqlen, seqlen, device="cuda")
    gen = torch.Generator(device="cuda").manual_seed(3)
    inputs = [torch.randn(2, 4, seqlen, 128, device="cuda", generator=gen).bfloat16()
              for _ in range(3)]
    for x in inputs:
        x[:, :, hidden_from:] = float("nan")
    inputs = [x.requires_grad_() for x in inputs]
    out = flex_attention(*inputs, block_mask=block_mask)
    grads = torch.autograd.grad(out, inputs, torch.ones_like(out))
    for name, grad in zip("qkv", grads):
        assert not grad.isnan().any(), name
        assert (grad[:, :, hidden_from:] == 0).all(), name
