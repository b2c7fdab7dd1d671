"""tileattn.flex's translation of score_mod / mask_mod into kernel hooks: each generated hook,
run by a tiny Triton kernel over a (batch, head, q_idx, kv_idx) grid, equals torch's eager
evaluation of the same Python function (exactly for masks and integer ops, to fp32 ulps for
float ops); the derivative hook equals torch.autograd's; errors name what cannot be
translated; the cache does not trace twice."""

import functools
import inspect

import pytest
import torch

import tileattn
from torch.nn.attention.flex_attention import and_masks, or_masks

from tileattn.flex import translate
from tileattn.flex.trace import UnsupportedModError

from .compile_helpers import run_without_interpreter
from .flex_functions import (alibi, causal, distance_bias, doc_ids_for, document, every_op,
                             linear_alibi, prefix_lm, relative_position, sliding_window, softcap,
                             softcapped_document_bias)
from .flex_hook_runner import (eager_mask_mod, eager_score_mod, eager_score_mod_grad,
                               run_mask_hook, run_score_hook)

# Hooks compute both sides of a torch.where (as compiled code does): numpy warns about the
# side that is thrown away (x / 0).
pytestmark = pytest.mark.filterwarnings("ignore:.*encountered in:RuntimeWarning")

BATCH, HEADS, SEQLEN_Q, SEQLEN_K = 2, 3, 37, 45     # odd: tiles cross the grid's end
CPU = torch.device("cpu")


@pytest.fixture(autouse=True)
def _hook_files_in_tmp(tmp_path, monkeypatch):
    monkeypatch.setenv("TILEATTN_CACHE_DIR", str(tmp_path))


def _generator(seed=0):
    return torch.Generator().manual_seed(seed)


SCALES = 6.0   # score magnitude: softcap and clamp branches both taken


def _scores(seed=1, rows=SEQLEN_Q, cols=SEQLEN_K):
    return torch.randn(BATCH, HEADS, rows, cols, generator=_generator(seed)) * SCALES


def _assert_close_ulps(got, want):
    """Float results: equal up to a few fp32 ulps of the values involved."""
    torch.testing.assert_close(got, want, rtol=1e-6, atol=4e-6, equal_nan=True)


# ---- masks ----------------------------------------------------------------------------------

MASKS = {
    "causal": lambda: causal,
    "sliding_window": lambda: sliding_window(7),
    "document": lambda: document(doc_ids_for(BATCH, SEQLEN_K, 4)),
    "prefix_lm": lambda: prefix_lm(11),
    "document_and_causal": lambda: and_masks(document(doc_ids_for(BATCH, SEQLEN_K, 3)), causal),
    "prefix_or_window": lambda: or_masks(prefix_lm(5), sliding_window(4)),
    "integer_semantics": lambda: (lambda b, h, q, kv: ((q - kv) // 3) % 4 == (kv - q) % (h + 2)),
    # Differences of a row and a column against constants or the head, either side: emitted as
    # a row-against-column compare.
    "separated_differences": lambda: (lambda b, h, q, kv: (5 > q - kv) & (kv - q < h + 3)
                                      & ((q - kv != 2) | (kv - (q + 1) >= -4))),
}


@pytest.mark.parametrize("name", list(MASKS))
def test_mask_hook_equals_torch(name):
    mask_mod = MASKS[name]()
    hooks = translate.translate_mods(None, mask_mod, device=CPU)
    got = run_mask_hook(hooks.mask_mod, hooks.mod_args, BATCH, HEADS, SEQLEN_Q, SEQLEN_K)
    want = eager_mask_mod(mask_mod, BATCH, HEADS, SEQLEN_Q, SEQLEN_K)
    assert 0 < want.sum() < want.numel()
    assert torch.equal(got, want)


def test_index_by_a_position_needs_no_wrap_around():
    """Positions are never negative: indexing by q_idx checks only the upper bound (the
    negative-index wrap and lower check cost about 75 SASS instructions a hooked block)."""
    hook = translate.translate_mods(None, document(doc_ids_for(BATCH, SEQLEN_K, 4)),
                                    device=CPU).mask_mod
    source = inspect.getsource(getattr(hook, "fn", hook))
    assert "q_idx < 0" not in source and "kv_idx < 0" not in source
    assert f"(q_idx < {SEQLEN_K})" in source and f"(kv_idx < {SEQLEN_K})" in source


def test_differences_of_a_row_and_a_column_are_compared_separated():
    """q - kv <= W is emitted as q - W <= kv (what the SASS count of a window block was taken on);
    a float constant or a difference along one axis keeps the difference."""
    def source(mask_mod):
        hook = translate.translate_mods(None, mask_mod, device=CPU).mask_mod
        return inspect.getsource(getattr(hook, "fn", hook))

    window = source(sliding_window(7))
    assert "q_idx - 7" in window and "< kv_idx" in window
    assert "<= 2.5" in source(lambda b, h, q, kv: q - kv <= 2.5)
    assert "<= 3" in source(lambda b, h, q, kv: (q - (q + 1)) <= 3)


def test_hooks_take_key_major_tiles():
    """A backward kernel may call hooks with q_idx [1, N] and kv_idx [M, 1]."""
    mask_mod = document(doc_ids_for(BATCH, SEQLEN_K, 4))
    score_mod = softcapped_document_bias(doc_ids_for(BATCH, SEQLEN_K, 4),
                                         torch.randn(HEADS, 8, generator=_generator(2)), 5.0)
    hooks = translate.translate_mods(score_mod, mask_mod, device=CPU)
    assert torch.equal(run_mask_hook(hooks.mask_mod, hooks.mod_args, BATCH, HEADS, SEQLEN_Q,
                                     SEQLEN_K, transposed=True),
                       eager_mask_mod(mask_mod, BATCH, HEADS, SEQLEN_Q, SEQLEN_K))
    scores = _scores()
    _assert_close_ulps(run_score_hook(hooks.score_mod, hooks.mod_args, scores, transposed=True),
                       eager_score_mod(score_mod, scores))


# ---- score mods and their derivatives -------------------------------------------------------

SCORE_MODS = {
    "alibi": lambda: alibi(torch.rand(HEADS, generator=_generator(3))),
    "softcap": lambda: softcap(5.0),
    "relative_position": lambda: relative_position(torch.randn(HEADS, 21, generator=_generator(4)),
                                                   10),
    "softcap_document_bias": lambda: softcapped_document_bias(
        doc_ids_for(BATCH, SEQLEN_K, 3), torch.randn(HEADS, 8, generator=_generator(5)), 4.0),
    "every_op": lambda: every_op,
}


@pytest.mark.parametrize("name", list(SCORE_MODS))
def test_score_hook_and_derivative_equal_torch(name):
    score_mod = SCORE_MODS[name]()
    hooks = translate.translate_mods(score_mod, None, device=CPU, with_grad=True)
    scores = _scores()
    _assert_close_ulps(run_score_hook(hooks.score_mod, hooks.mod_args, scores),
                       eager_score_mod(score_mod, scores))
    _assert_close_ulps(run_score_hook(hooks.score_mod_grad, hooks.mod_args, scores),
                       eager_score_mod_grad(score_mod, scores))


def test_float_floor_division_follows_torch():
    """Float // and remainder with both signs (torch's floor semantics, not fmod's); not
    differentiable, so forward only."""
    def floor_divisions(score, b, h, q_idx, kv_idx):
        return (score // 0.7 + torch.remainder(score, -0.7) + (score * 3) // -2.5
                + torch.div(score, q_idx - 20, rounding_mode="floor")
                + torch.div(score, 1.5, rounding_mode="trunc"))
    hooks = translate.translate_mods(floor_divisions, None, device=CPU)
    scores = _scores(seed=6)
    _assert_close_ulps(run_score_hook(hooks.score_mod, hooks.mod_args, scores),
                       eager_score_mod(floor_divisions, scores))


def test_position_arithmetic_converts_positions_not_scores():
    """|q_idx - kv_idx| times a float (ALiBi) is computed from the positions converted to
    float32 by integer and float ops (exact below flex's length limit), not by converting the
    integer tile: int-to-float conversions share the exp2 unit. Values equal torch's
    (test_score_hook_and_derivative_equal_torch runs ALiBi and every_op)."""
    source = translate.translate(alibi(torch.rand(HEADS)), "score_mod").source
    assert ("tl.abs(((hook_ops.position_to_float(q_idx)) - "
            "(hook_ops.position_to_float(kv_idx))))") in source
    assert ".to(tl.float32)" not in source
    query = torch.empty(1, 1, (1 << 22) + 1, 64, dtype=torch.float16, device="meta")
    with pytest.raises(ValueError, match="sequence length"):
        tileattn.flex_attention(query, query, query)


LINEAR_SLOPES = torch.rand(HEADS)
LINEAR_FACTORS = torch.arange(HEADS, dtype=torch.int32)
LINEAR_CASES = {
    "linear alibi": (linear_alibi(LINEAR_SLOPES), True),
    "terms": (distance_bias(LINEAR_SLOPES, torch.rand(2, HEADS)), True),
    "bias per head": (lambda s, b, h, q, kv: s + LINEAR_SLOPES[h], True),
    "int distance": (lambda s, b, h, q, kv: s + (kv - q) * 3, True),
    "divided": (lambda s, b, h, q, kv: s + (q - kv) / LINEAR_SLOPES[h] - 2, True),
    "alibi with abs": (alibi(LINEAR_SLOPES), False),
    "query term only": (lambda s, b, h, q, kv: s + q * 0.5, False),
    "scaled score": (lambda s, b, h, q, kv: s * 2 - (q - kv), False),
    "product of positions": (lambda s, b, h, q, kv: s + q * kv * 1.0, False),
    "int that wraps": (lambda s, b, h, q, kv: s + (q - kv) * 1000 * 1000, False),
    "int factor per head": (lambda s, b, h, q, kv: s + (q - kv) * LINEAR_FACTORS[h], False),
    "bf16 term": (lambda s, b, h, q, kv: s + (LINEAR_SLOPES[h] * (q - kv)).bfloat16(), False),
    "truncated": (lambda s, b, h, q, kv: s + (0.5 * (q - kv)).int(), False),
    "softcap": (softcap(20.0), False),
}


@pytest.mark.parametrize("name", LINEAR_CASES)
def test_distance_linear_form(name):
    """flex/linear.py proves score + c (q - kv) + d symbolically and refuses everything else
    (the Hopper kernel then adds the mod as row and column terms). The GPU tests run the
    kernel on the linear cases (tests/gpu/test_flex_sm90.py)."""
    fn, linear = LINEAR_CASES[name]
    assert translate.translate_mods(fn, None, device=CPU).score_linear is linear


def test_derivative_hook_loads_only_what_it_needs():
    """d(score - bias[h]) / d score = 1: the derivative must not load the bias."""
    hooks = translate.translate_mods(alibi(torch.rand(HEADS)), None, device=CPU, with_grad=True)
    assert len(hooks.mod_args) == 1            # the score_mod's slopes only
    source = translate.translate(alibi(torch.rand(HEADS)), "score_mod_grad").source
    assert "tl.load" not in source


def test_loads_stay_inside_captured_tensors():
    """Hooks see positions past the sequence ends: indexing outside a captured tensor loads 0,
    never the memory around it (here a sentinel 99 on both sides of a strided view)."""
    doc_ids = doc_ids_for(1, SEQLEN_K, 4)[0]
    storage = torch.full((3 * SEQLEN_K + 40,), 99, dtype=torch.int32)
    inside = storage[20:20 + 2 * SEQLEN_K:2]          # strided, offset into its storage
    inside.copy_(doc_ids)
    beyond = 19                                      # positions past the tensor's end
    hooks = translate.translate_mods(
        None, lambda b, h, q, kv: (inside[q] == inside[kv]) & (inside[kv - 3] >= 0), device=CPU)
    got = run_mask_hook(hooks.mask_mod, hooks.mod_args, 1, 1, SEQLEN_K + beyond,
                        SEQLEN_K + beyond)
    padded = torch.cat([doc_ids, torch.zeros(beyond, dtype=torch.int32)])
    want = eager_mask_mod(lambda b, h, q, kv: padded[q] == padded[kv], 1, 1,
                          SEQLEN_K + beyond, SEQLEN_K + beyond)
    # inside[kv - 3] counts from the end for kv < 3 (as torch indexing does), 0 past the end.
    assert torch.equal(got, want)


def test_captured_tensor_kinds():
    """0-d, bool, fp16 and int64 captures; constant indices; a tensor indexed by values loaded
    from another (a gather of a gather); a transposed (non-contiguous) table."""
    cap = torch.tensor(7.5)
    allowed = torch.rand(BATCH, HEADS, generator=_generator(7)) < 0.7
    half_table = torch.randn(HEADS, 9, generator=_generator(8)).half()
    positions = torch.randint(-5, 5, (SEQLEN_K,), generator=_generator(9))       # int64
    table_t = torch.randn(SEQLEN_K, HEADS, generator=_generator(10)).t()        # [H, S_K]

    def kinds(score, b, h, q_idx, kv_idx):
        gathered = table_t[h, positions[kv_idx] + 5]
        return torch.where(allowed[b, h], score / cap, score * half_table[h, 3]) + gathered \
            + half_table[0][-1] + positions[q_idx % 7]

    def kinds_mask(b, h, q_idx, kv_idx):
        return allowed[b][h] & (positions[kv_idx] <= 2)
    hooks = translate.translate_mods(kinds, kinds_mask, device=CPU)
    assert len(hooks.mod_args) == 7
    scores = _scores(seed=11)
    _assert_close_ulps(run_score_hook(hooks.score_mod, hooks.mod_args, scores),
                       eager_score_mod(kinds, scores))
    assert torch.equal(run_mask_hook(hooks.mask_mod, hooks.mod_args, BATCH, HEADS, SEQLEN_Q,
                                     SEQLEN_K),
                       eager_mask_mod(kinds_mask, BATCH, HEADS, SEQLEN_Q, SEQLEN_K))


# ---- errors ---------------------------------------------------------------------------------

def test_unsupported_op_is_named():
    def uses_atan(score, b, h, q_idx, kv_idx):
        return torch.atan(score)
    with pytest.raises(NotImplementedError, match=r"aten\.atan.*uses_atan"):
        translate.translate_mods(uses_atan, None, device=CPU)


@pytest.mark.parametrize("body", ["if", "item"])
def test_python_control_flow_on_data_is_refused(body):
    def branches(score, b, h, q_idx, kv_idx):
        if q_idx > kv_idx:
            return score
        return -score

    def reads_item(score, b, h, q_idx, kv_idx):
        return score * float(q_idx.item())
    fn = branches if body == "if" else reads_item
    with pytest.raises(UnsupportedModError, match=r"torch\.where"):
        translate.translate_mods(fn, None, device=CPU)


def test_whole_tensor_ops_and_tensor_literals_are_refused():
    slopes = torch.rand(HEADS)
    with pytest.raises(NotImplementedError, match="whole captured tensor"):
        translate.translate_mods(lambda s, b, h, q, kv: s + (slopes * 2)[h], None, device=CPU)
    with pytest.raises(NotImplementedError, match="created inside the function"):
        translate.translate_mods(lambda s, b, h, q, kv: s + torch.tensor([1.0, 2.0, 3.0])[h],
                                 None, device=CPU)


def test_captures_on_another_device_or_requiring_grad_are_named():
    elsewhere = torch.zeros(HEADS, device="meta")

    def on_meta(score, b, h, q_idx, kv_idx):
        return score + elsewhere[h]
    with pytest.raises(ValueError, match=r"'elsewhere' of on_meta.*is on meta"):
        translate.translate_mods(on_meta, None, device=CPU)
    learned = torch.zeros(HEADS, requires_grad=True)

    def learned_bias(score, b, h, q_idx, kv_idx):
        return score + learned[h]
    with pytest.raises(ValueError, match=r"'learned' of learned_bias.*requires grad"):
        translate.translate_mods(learned_bias, None, device=CPU)


# ---- the cache ------------------------------------------------------------------------------

def test_second_translation_does_not_trace():
    mask_mod = document(doc_ids_for(BATCH, SEQLEN_K, 4))
    translate.translate_mods(None, mask_mod, device=CPU)
    traces = translate.cache_info()["traces"]
    hooks = translate.translate_mods(None, mask_mod, device=CPU)
    assert translate.cache_info()["traces"] == traces
    assert hooks.mod_args[0] is mask_mod.__closure__[0].cell_contents


def test_recreated_function_reuses_its_hook_with_new_tensors():
    """A mask re-made each step over new doc_ids of the same shape is not traced again, and
    its hook reads the new tensor."""
    first = document(doc_ids_for(BATCH, SEQLEN_K, 4, seed=1))
    first_hooks = translate.translate_mods(None, first, device=CPU)
    traces = translate.cache_info()["traces"]
    new_ids = doc_ids_for(BATCH, SEQLEN_K, 2, seed=2)
    second = document(new_ids)
    hooks = translate.translate_mods(None, second, device=CPU)
    assert translate.cache_info()["traces"] == traces
    assert hooks.mask_mod is first_hooks.mask_mod and hooks.mod_args[0] is new_ids
    assert torch.equal(run_mask_hook(hooks.mask_mod, hooks.mod_args, BATCH, 1, SEQLEN_Q,
                                     SEQLEN_K),
                       eager_mask_mod(second, BATCH, 1, SEQLEN_Q, SEQLEN_K))


def test_changed_closure_values_trace_again():
    translate.translate_mods(None, sliding_window(8), device=CPU)
    traces = translate.cache_info()["traces"]
    hooks = translate.translate_mods(None, sliding_window(3), device=CPU)
    assert translate.cache_info()["traces"] == traces + 1
    assert torch.equal(run_mask_hook(hooks.mask_mod, hooks.mod_args, 1, 1, SEQLEN_Q, SEQLEN_K),
                       eager_mask_mod(sliding_window(3), 1, 1, SEQLEN_Q, SEQLEN_K))
    translate.translate_mods(None, document(torch.zeros(1, 7, dtype=torch.int32)), device=CPU)
    traces = translate.cache_info()["traces"]
    translate.translate_mods(None, document(torch.zeros(1, 9, dtype=torch.int32)), device=CPU)
    assert translate.cache_info()["traces"] == traces + 1    # shape changed: baked into code


def test_tensors_the_walk_cannot_reach_bind_by_identity():
    """A tensor reached through a cache the closure walk cannot look into is bound to the
    function object: the same function hits the cache, a re-made one is traced again."""
    def make():
        @functools.lru_cache(maxsize=None)
        def bias():
            return torch.randn(HEADS)
        bias()

        def biased(score, b, h, q_idx, kv_idx):
            return score + bias()[h]
        return biased
    first = make()
    hooks = translate.translate_mods(first, None, device=CPU)
    traces = translate.cache_info()["traces"]
    assert translate.translate_mods(first, None, device=CPU).mod_args == hooks.mod_args
    assert translate.cache_info()["traces"] == traces
    second = make()        # same code and closure signature, another tensor
    second_hooks = translate.translate_mods(second, None, device=CPU)
    assert translate.cache_info()["traces"] == traces + 1
    scores = _scores(seed=12)
    _assert_close_ulps(run_score_hook(second_hooks.score_mod, second_hooks.mod_args, scores),
                       eager_score_mod(second, scores))


# ---- the generated code compiles for the GPU ---------------------------------------------------

COMPILE_CHILD = r'''
import json, os, sys, torch, triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
sys.path.insert(0, os.getcwd())
from tests.test_flex_translate import SCORE_MODS, MASKS
from tests.flex_hook_runner import mask_mod_grid_kernel, score_mod_grid_kernel
from tileattn.flex import translate
from tileattn.kernels.compile import _POINTER_TYPES

def compile_hook(kernel, hook_name, hook, mod_args, extra):
    signature = {"mod_args": tuple(_POINTER_TYPES[t.dtype] for t in mod_args),
                 "num_heads": "i32", "rows": "i32", "cols": "i32", hook_name: "constexpr",
                 "TRANSPOSED": "constexpr", "BLOCK": "constexpr", **extra}
    source = ASTSource(fn=kernel, signature=signature,
                       constexprs={hook_name: hook, "TRANSPOSED": False, "BLOCK": 32})
    compiled = triton.compile(source, target=GPUTarget("cuda", 90, 32), options={"num_warps": 4})
    return len(compiled.asm["ptx"])

sizes = {}
for name, role in (("every_op", "score_mod"), ("softcap_document_bias", "score_mod_grad")):
    hooks = translate.translate_mods(SCORE_MODS[name](), None, device=torch.device("cpu"),
                                     with_grad=True)
    sizes[f"{name}.{role}"] = compile_hook(
        score_mod_grid_kernel, "SCORE_MOD", getattr(hooks, role), hooks.mod_args,
        {"score_ptr": "*fp32", "out_ptr": "*fp32"})
hooks = translate.translate_mods(None, MASKS["document_and_causal"](), device=torch.device("cpu"))
sizes["document_and_causal"] = compile_hook(mask_mod_grid_kernel, "MASK_MOD", hooks.mask_mod,
                                            hooks.mod_args, {"out_ptr": "*i8"})
print(json.dumps(sizes))
'''


def test_generated_hooks_compile_for_sm90(tmp_path):
    cache = f"import os; os.environ['TILEATTN_CACHE_DIR'] = {str(tmp_path)!r}\n"
    sizes = run_without_interpreter(COMPILE_CHILD.replace("import json", cache + "import json"))
    assert len(sizes) == 3 and all(size > 1000 for size in sizes.values())
