"""tileattn.flex_attention without its kernel: argument checks; BlockMask conversion against
torch's own block mask contents; and, with the fp64 stand-in for the kernel entry point
(tests/flex_reference.py), results against torch's eager flex_attention — which checks
translation, block lists and argument plumbing end to end."""

import pytest
import torch
from torch.nn.attention.flex_attention import BlockMask, create_block_mask

from tileattn.flex import api as flex_api
from tileattn.flex import flex_attention
from tileattn.flex.block_mask import block_mask_tensors, largest_tile
from tileattn.ops import flex as flex_op

from .conftest import LSE_TOLERANCES, TOLERANCES
from .flex_cases import CASES, case, check_against_torch
from .flex_reference import dense_blocks, reference_attention_with_mods
from .flex_functions import causal, doc_ids_for, document, sliding_window

pytestmark = pytest.mark.filterwarnings("ignore:.*encountered in:RuntimeWarning")
CPU = torch.device("cpu")


@pytest.fixture(autouse=True)
def _hook_files_in_tmp(tmp_path, monkeypatch):
    monkeypatch.setenv("TILEATTN_CACHE_DIR", str(tmp_path))


@pytest.fixture
def fp64_kernel_stand_in(monkeypatch):
    monkeypatch.setattr(flex_op, "attention_with_mods", reference_attention_with_mods,
                        raising=False)


# ---- results, with the fp64 stand-in for the kernel -------------------------------------------

@pytest.mark.parametrize("name", CASES)
def test_matches_torch_flex_attention(name, fp64_kernel_stand_in):
    check_against_torch(flex_attention, case(name), TOLERANCES, LSE_TOLERANCES)


def test_fp8_with_descales_matches_torch(fp64_kernel_stand_in):
    check_against_torch(flex_attention, case("document_alibi", dtype=torch.float8_e4m3fn),
                        TOLERANCES, LSE_TOLERANCES)


def test_kernel_receives_the_contract(fp64_kernel_stand_in, monkeypatch):
    """What attention_with_mods is handed: [B, S, H, D] views of the inputs (no copies),
    out [B, Sq, Hq, Dv] over the returned [B, Hq, Sq, Dv] tensor, the hooks, mod_args and
    the block lists."""
    seen = {}

    def recording(q, k, v, out, lse, **kwargs):
        seen.update(q=q, k=k, v=v, out=out, lse=lse, **kwargs)
        reference_attention_with_mods(q, k, v, out, lse, **kwargs)
    monkeypatch.setattr(flex_op, "attention_with_mods", recording)
    arguments = case("document_alibi")
    out = flex_attention(**arguments)
    query = arguments["query"]
    assert seen["q"].shape == (2, 45, 2, 64) and seen["q"].data_ptr() == query.data_ptr()
    assert seen["q"].stride() == query.transpose(1, 2).stride()
    assert seen["out"].data_ptr() == out.data_ptr() and seen["out"].shape == (2, 45, 2, 64)
    assert seen["lse"] is None and seen["softmax_scale"] == 64 ** -0.5
    assert seen["mask_mod"] is not None and seen["score_mod"] is not None
    assert len(seen["mod_args"]) == 2     # alibi's slopes, then the document mask's doc_ids
    lists = seen["block_mask_tensors"]
    assert (lists.q_block_size, lists.kv_block_size) == (32, 16)
    assert seen["q_descale"] is None


# ---- argument checks ------------------------------------------------------------------------

def _args(**changes):
    arguments = case("causal")
    arguments.update(changes)
    return arguments


@pytest.mark.parametrize("changes, error, pattern", [
    (dict(query=torch.randn(2, 45, 64).bfloat16()), ValueError, "query must have 4"),
    (dict(key="not a tensor"), TypeError, "key must be a torch.Tensor"),
    (dict(query=torch.randn(2, 2, 45, 64)), TypeError, "query must be float16"),
    (dict(value=torch.randn(2, 2, 45, 64).half()), TypeError, "share one dtype"),
    (dict(query=torch.randn(2, 4, 45, 64).bfloat16()), ValueError, "enable_gqa=True"),
    (dict(query=torch.randn(2, 3, 45, 64).bfloat16(), enable_gqa=True), ValueError,
     "multiple of key/value"),
    (dict(query=torch.randn(2, 2, 45, 48).bfloat16(), key=torch.randn(2, 2, 45, 48).bfloat16(),
          value=torch.randn(2, 2, 45, 48).bfloat16()), ValueError, "head_dim must be one of"),
    (dict(key=torch.randn(3, 2, 45, 64).bfloat16(), value=torch.randn(3, 2, 45, 64).bfloat16()),
     ValueError, "key/value batch"),
    (dict(score_mod=lambda s, b, h: s), TypeError, "score_mod must be a function"),
    (dict(block_mask="causal"), TypeError, "block_mask must be"),
    (dict(scale=float("nan")), ValueError, "scale must be a finite"),
    (dict(return_lse=1), TypeError, "return_lse must be a bool"),
    (dict(q_descale=torch.ones(())), ValueError, "apply only to FP8"),
    (dict(query=torch.randn(2, 2, 64, 45).bfloat16().transpose(2, 3)), ValueError,
     "query must have a contiguous last dim"),
])
def test_bad_arguments_are_named(changes, error, pattern, fp64_kernel_stand_in):
    with pytest.raises(error, match=pattern):
        flex_attention(**_args(**changes))


def test_block_mask_checks(fp64_kernel_stand_in):
    arguments = case("causal")
    for lengths, pattern in (((40, 45), "created for sequence lengths"),
                             ((45, 50), "block_mask._adjust")):
        mask = create_block_mask(causal, 1, 1, *lengths, device="cpu", BLOCK_SIZE=16)
        with pytest.raises(ValueError, match=pattern):
            flex_attention(**{**arguments, "block_mask": mask})
    odd_blocks = create_block_mask(causal, 1, 1, 45, 45, device="cpu", BLOCK_SIZE=24)
    with pytest.raises(ValueError, match="multiples of 16"):
        flex_attention(**{**arguments, "block_mask": odd_blocks})
    three_heads = create_block_mask(causal, 1, 3, 45, 45, device="cpu", BLOCK_SIZE=16)
    with pytest.raises(ValueError, match=r"1 \(broadcast\) or the query's"):
        flex_attention(**{**arguments, "block_mask": three_heads})
    with pytest.raises(ValueError, match="sliced"):
        flex_attention(**{**arguments, "block_mask": arguments["block_mask"][:, :1]})
    elsewhere = create_block_mask(causal, 1, 1, 45, 45, device="cpu", BLOCK_SIZE=16).to("meta")
    with pytest.raises(ValueError, match="block_mask.kv_num_blocks is on meta"):
        flex_attention(**{**arguments, "block_mask": elsewhere})


def test_fp8_inputs_requiring_grad_are_refused_and_16_bit_ones_differentiate():
    """FP8 has no backward (TypeError naming the input); 16-bit outputs carry a gradient
    (tests/test_flex_backward.py checks its values)."""
    arguments = case("causal", dtype=torch.float8_e4m3fn)
    arguments["query"].requires_grad_(True)
    with pytest.raises(TypeError, match="query requires grad"):
        flex_attention(**arguments)
    arguments = case("causal")
    arguments["key"].requires_grad_(True)
    assert flex_attention(**arguments).grad_fn is not None


def test_cpu_without_the_interpreter_is_refused(monkeypatch, fp64_kernel_stand_in):
    monkeypatch.setattr("tileattn.checks.interpreter_active", lambda: False)
    with pytest.raises(ValueError, match="TRITON_INTERPRET=1"):
        flex_attention(**case("causal"))


# ---- BlockMask conversion -------------------------------------------------------------------

BLOCK_MASKS = {
    "causal_broadcast": lambda: create_block_mask(causal, None, None, 45, 45, device="cpu",
                                                  BLOCK_SIZE=16),
    "document_per_batch": lambda: create_block_mask(document(doc_ids_for(2, 61, 4)), 2, 1, 61,
                                                    61, device="cpu", BLOCK_SIZE=(32, 16)),
    "window_per_head": lambda: create_block_mask(
        lambda b, h, q, kv: (q >= kv) & (q - kv < 8 * (h + 1)), 1, 3, 70, 83, device="cpu",
        BLOCK_SIZE=16),
    "no_full_blocks": lambda: create_block_mask(sliding_window(20), 2, 3, 50, 50, device="cpu",
                                                BLOCK_SIZE=(16, 32), separate_full_blocks=False),
}


@pytest.mark.parametrize("name", list(BLOCK_MASKS))
def test_block_lists_are_torch_own(name):
    mask = BLOCK_MASKS[name]()
    batch, heads = 2, 3
    seqlen_q, seqlen_k = mask.seq_lengths
    lists = block_mask_tensors(mask, batch=batch, num_q_heads=heads, seqlen_q=seqlen_q,
                               seqlen_k=seqlen_k, device=CPU, transposed=True)
    assert (lists.q_block_size, lists.kv_block_size) == tuple(mask.BLOCK_SIZE)
    pairs = [("kv_num_blocks", "kv_indices"), ("full_kv_num_blocks", "full_kv_indices"),
             ("q_num_blocks", "q_indices"), ("full_q_num_blocks", "full_q_indices")]
    for count_name, index_name in pairs:
        counts, indices = getattr(lists, count_name), getattr(lists, index_name)
        assert counts.dtype == indices.dtype == torch.int32
        assert counts.shape[:2] == indices.shape[:2] == (batch, heads)
        theirs = getattr(mask, count_name), getattr(mask, index_name)
        if theirs[0] is None:
            assert name == "no_full_blocks" and not counts.any()
            continue
        for ours, torch_own in zip((counts, indices), theirs):
            assert torch.equal(ours, torch_own.expand_as(ours))
            for dim in (0, 1):       # broadcast dims stay stride 0: no copy
                if torch_own.shape[dim] == 1:
                    assert ours.stride(dim) == 0
    # The transposed lists are the transpose of the forward lists.
    num_kv_blocks = -(-seqlen_k // lists.kv_block_size)
    num_q_blocks = -(-seqlen_q // lists.q_block_size)
    for forward, backward in (pairs[0], pairs[2]), (pairs[1], pairs[3]):
        by_query = dense_blocks(getattr(lists, forward[0]), getattr(lists, forward[1]),
                                num_kv_blocks)[:, :, :num_q_blocks]
        by_key = dense_blocks(getattr(lists, backward[0]), getattr(lists, backward[1]),
                              num_q_blocks)
        assert torch.equal(by_query.transpose(2, 3), by_key)


def test_transposed_lists_are_computed_when_missing():
    made = create_block_mask(document(doc_ids_for(1, 70, 3)), 1, 1, 70, 70, device="cpu",
                             BLOCK_SIZE=16)
    bare = BlockMask.from_kv_blocks(made.kv_num_blocks, made.kv_indices,
                                    made.full_kv_num_blocks, made.full_kv_indices,
                                    BLOCK_SIZE=16, mask_mod=made.mask_mod, seq_lengths=(70, 70),
                                    compute_q_blocks=False)
    assert bare.q_indices is None
    lists = block_mask_tensors(bare, batch=1, num_q_heads=1, seqlen_q=70, seqlen_k=70,
                               device=CPU, transposed=True)
    for name in ("q_num_blocks", "q_indices", "full_q_num_blocks", "full_q_indices"):
        assert torch.equal(getattr(lists, name), getattr(made, name)), name


def test_block_lists_with_bad_indices_are_refused():
    mask = create_block_mask(causal, 1, 1, 45, 45, device="cpu", BLOCK_SIZE=16)
    arguments = dict(batch=1, num_q_heads=1, seqlen_q=45, seqlen_k=45, device=CPU)
    block_mask_tensors(mask, **arguments)
    mask.kv_indices[0, 0, 0, 0] = 3          # in place, after a successful check: only 3 blocks
    with pytest.raises(ValueError, match=r"kv_indices lists blocks outside \[0, 3\)"):
        block_mask_tensors(mask, **arguments)
    mask.kv_indices[0, 0, 0, 0] = 0
    mask.full_kv_num_blocks[0, 0, 1] = -1
    with pytest.raises(ValueError, match="full_kv_num_blocks has counts outside"):
        block_mask_tensors(mask, **arguments)


def test_no_block_mask_stand_in_means_dense():
    from torch.nn.attention.flex_attention import _create_empty_block_mask
    query = torch.empty(1, 1, 45, 64)
    assert block_mask_tensors(_create_empty_block_mask(query, query), batch=1, num_q_heads=1,
                              seqlen_q=45, seqlen_k=45, device=CPU) is None


def test_largest_tile_divides_the_block():
    assert largest_tile(128, 64) == 64 and largest_tile(128, 128) == 128
    assert largest_tile(48, 64) == 16 and largest_tile(96, 64) == 32 and largest_tile(80, 128) == 16
    assert all(1024 % largest_tile(1024, t) == 0 for t in (16, 32, 64, 128, 256))


def test_block_lists_are_read_once_per_mask(monkeypatch):
    """The host read that checks a BlockMask happens on its first use only (forward and
    backward uses alike), not on every call."""
    mask = create_block_mask(sliding_window(20), 1, 1, 45, 45, device="cpu", BLOCK_SIZE=16,
                             separate_full_blocks=False)
    arguments = dict(batch=1, num_q_heads=1, seqlen_q=45, seqlen_k=45, device=CPU)
    block_mask_tensors(mask, **arguments)

    def no_host_read(*args, **kwargs):
        raise AssertionError("block lists read again")
    monkeypatch.setattr(torch, "stack", no_host_read)
    block_mask_tensors(mask, **arguments)
    block_mask_tensors(mask, **arguments, transposed=True)
