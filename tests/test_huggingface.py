"""tileattn as a transformers attention backend, on tiny random models built from configs.

Each model runs in bf16 (Llama also fp16) with attn_implementation="tileattn" and "eager" on the
same weights; both are compared with the same weights in float32 under eager attention. The
tolerance follows FA3's yardstick: tileattn's relative L2 error in the logits may be at most
twice eager's own error in that dtype, plus one rounding unit of the dtype (bf16 2^-8, fp16
2^-11). Each test checks that the calls reached tileattn (and did not fall back to eager).
"""

from __future__ import annotations

import warnings

import pytest
import torch

import tileattn
import tileattn.reference

transformers = pytest.importorskip("transformers")

from tileattn.integrations import huggingface  # noqa: E402
from tileattn.reference import attention_reference  # noqa: E402
from transformers.masking_utils import (ALL_MASK_ATTENTION_FUNCTIONS,  # noqa: E402
                                        create_causal_mask)

from .conftest import TOLERANCES  # noqa: E402
from .integration_helpers import ROUNDING_UNIT, counting, relative_error  # noqa: E402

NAME = huggingface.register()
SEQLEN = 11     # odd, not a multiple of any block size
PAD = 3         # padding tokens in the second row

COMMON = dict(hidden_size=128, intermediate_size=256, num_attention_heads=2, num_key_value_heads=1,
              head_dim=64, num_hidden_layers=2, vocab_size=100, pad_token_id=0)
CONFIGS = {
    "llama": lambda: transformers.LlamaConfig(**COMMON),
    "qwen2": lambda: transformers.Qwen2Config(**COMMON),
    # sliding_window 4 < SEQLEN: the window is active in prefill
    "mistral": lambda: transformers.MistralConfig(**COMMON, sliding_window=4),
    # layer 0 slides over 4 keys, layer 1 is global; softcap 2 bends scores of size ~1-5;
    # scaling 32^-0.5, not head_dim^-0.5
    "gemma2": lambda: transformers.Gemma2Config(
        **COMMON, sliding_window=4, attn_logit_softcapping=2.0, query_pre_attn_scalar=32,
        layer_types=["sliding_attention", "full_attention"]),
}

def make_model(family, dtype=torch.bfloat16, device="cpu", **overrides):
    torch.manual_seed(0)
    config = CONFIGS[family]()
    for key, value in overrides.items():
        setattr(config, key, value)
    model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="eager")
    with torch.no_grad():  # sharper attention than the 0.02-std init, so masking errors show
        for layer in model.model.layers:
            layer.self_attn.q_proj.weight.mul_(12)
            layer.self_attn.k_proj.weight.mul_(12)
    return model.to(device=device, dtype=dtype).eval()


def inputs(padding, seqlen=SEQLEN, pad=PAD, device="cpu"):
    torch.manual_seed(1)
    ids = torch.randint(3, 100, (2, seqlen), device=device)
    mask = torch.ones_like(ids)
    if padding == "left":
        mask[1, :pad] = 0
    elif padding == "right":
        mask[1, -pad:] = 0
    return ids.masked_fill(mask == 0, 0), mask


def logits(model, implementation, ids, mask, **kwargs):
    model.set_attn_implementation(implementation)
    with torch.no_grad():
        return model(ids, attention_mask=mask, **kwargs).logits.float()


def assert_close_to_eager(model, ids, mask, dtype, **kwargs):
    """tileattn's logits within twice eager's error (same dtype) of float32 eager, plus one
    rounding unit; compared where the query is a real token."""
    valid = mask.bool()
    got = logits(model, NAME, ids, mask, **kwargs)[valid]
    eager = logits(model, "eager", ids, mask, **kwargs)[valid]
    reference = logits(model.float(), "eager", ids, mask, **kwargs)[valid]
    model.to(dtype)
    bound = 2 * relative_error(eager, reference) + ROUNDING_UNIT[dtype]
    assert relative_error(got, reference) <= bound


@pytest.fixture(autouse=True)
def tileattn_calls(monkeypatch):
    """The positional arguments of each call that reaches tileattn in a test, by function."""
    calls = {}
    for name in ("attention", "attention_varlen"):
        monkeypatch.setattr(tileattn, name, counting(getattr(tileattn, name)))
        calls[name] = getattr(tileattn, name).calls
    return calls


@pytest.fixture(autouse=True)
def fallback_is_an_error():
    """A call that should run tileattn must not quietly fall back to eager."""
    with warnings.catch_warnings():
        warnings.simplefilter("error", huggingface.FallbackWarning)
        yield


# ---- registration and the mask side -----------------------------------------------------------

def test_register_puts_both_functions_under_one_name_and_is_idempotent():
    assert huggingface.register() == NAME == huggingface.register("tileattn")
    assert NAME in transformers.AttentionInterface() and NAME in ALL_MASK_ATTENTION_FUNCTIONS
    assert ALL_MASK_ATTENTION_FUNCTIONS[NAME] is huggingface.padding_mask
    assert huggingface.register("tileattn-fp8", fp8=True) == "tileattn-fp8"
    assert transformers.AttentionInterface()["tileattn-fp8"].keywords == {"fp8": True}
    for bad in ("", "my flash", "flash_tileattn", "sdpa2", "org/kernel", 3):
        with pytest.raises(ValueError, match="name"):
            huggingface.register(bad)
    with pytest.raises(TypeError, match="fp8"):
        huggingface.register("tileattn", fp8=1)


def test_without_the_mask_side_transformers_drops_the_padding_and_we_refuse():
    """transformers builds no mask at all for a name without a mask function: a padded batch
    would silently attend to its padding. register() adds both; a bare attention function is
    refused with a message naming register()."""
    config = CONFIGS["llama"]()
    ids, mask = inputs("left")
    embeds = torch.zeros(2, SEQLEN, 8)
    transformers.AttentionInterface.register("tileattn_nomask", huggingface.attention_forward)
    config._attn_implementation = "tileattn_nomask"
    assert create_causal_mask(config, embeds, mask.bool(), None) is None    # padding lost
    config._attn_implementation = NAME
    assert torch.equal(create_causal_mask(config, embeds, mask.bool(), None), mask.bool())
    model = make_model("llama")
    model.config._attn_implementation = "tileattn_nomask"
    with pytest.raises(ValueError, match="register"):
        with torch.no_grad():
            model(ids, attention_mask=mask)


def test_padding_mask_shapes():
    valid = torch.ones(2, 7, dtype=torch.bool)
    padded = valid.clone()
    padded[1, :2] = False
    assert huggingface.padding_mask(2, 7, 7, attention_mask=valid) is None
    assert torch.equal(huggingface.padding_mask(2, 7, 7, attention_mask=padded), padded)
    # decode against a sliding-window cache: the mask's last kv_length columns
    assert huggingface.padding_mask(2, 1, 4, 6, 3, attention_mask=padded) is None
    padded[1, 4] = False
    assert torch.equal(huggingface.padding_mask(2, 1, 4, 6, 3, attention_mask=padded),
                       padded[:, -4:])
    # static cache of 16 slots, 6 written, no 2-D mask: the written keys
    assert torch.equal(huggingface.padding_mask(2, 1, 16, 5, 0, device="cpu"),
                       torch.ones(2, 6, dtype=torch.bool))
    assert huggingface.padding_mask(2, 1, 6, 5, 0) is None   # dynamic cache: all written


def test_mask_patterns_beyond_causal_get_eager_masks_and_run_eager():
    """An or/and mask function (e.g. image tokens) is a rule tileattn cannot express: the mask
    function returns transformers' 4-D eager mask and the call runs eager attention, warned."""
    config = CONFIGS["llama"]()
    config._attn_implementation = NAME
    ids, mask = inputs("none")
    def see_first_key(batch_idx, head_idx, q_idx, kv_idx):
        return kv_idx == 0
    embeds = torch.zeros(2, SEQLEN, 8)
    dense = create_causal_mask(config, embeds, mask, None, or_mask_function=see_first_key)
    assert dense.shape == (2, 1, SEQLEN, SEQLEN) and dense.is_floating_point()
    model = make_model("llama")
    model.set_attn_implementation(NAME)
    with pytest.warns(huggingface.FallbackWarning, match="4-D attention mask"):
        with torch.no_grad():
            got = model(ids, attention_mask=dense).logits
    model.set_attn_implementation("eager")
    with torch.no_grad():
        assert torch.equal(got, model(ids, attention_mask=dense).logits)


# ---- logits and generation against eager ------------------------------------------------------

@pytest.mark.parametrize("family", list(CONFIGS))
@pytest.mark.parametrize("padding", ["none", "left", "right"])
def test_logits_match_eager(family, padding, tileattn_calls):
    """Padded batches go through attention_varlen; Mistral and Gemma-2's sliding window (4 keys,
    shorter than the sequence) and Gemma-2's softcap and 32^-0.5 scaling through the kernel."""
    model = make_model(family)
    ids, mask = inputs(padding)
    assert_close_to_eager(model, ids, mask, torch.bfloat16)
    used = "attention" if padding == "none" else "attention_varlen"
    assert len(tileattn_calls[used]) == model.config.num_hidden_layers


def test_logits_match_eager_fp16():
    model = make_model("llama", torch.float16)
    ids, mask = inputs("none")
    assert_close_to_eager(model, ids, mask, torch.float16)


def test_q_k_v_reach_tileattn_as_views(tileattn_calls):
    """[B, H, S, D] -> [B, S, H, D] by strides: tileattn reads transformers' tensors in place.
    Sq < Sk (a decode step): causal aligned bottom-right, checked against the fp64 reference."""
    module = make_model("llama").model.layers[0].self_attn
    module.config._attn_implementation = NAME
    query = torch.randn(2, 2, 5, 64, dtype=torch.bfloat16)
    key, value = (torch.randn(2, 1, 9, 64, dtype=torch.bfloat16) for _ in range(2))
    out, weights = huggingface.attention_forward(module, query, key, value, None, scaling=0.125)
    assert weights is None and out.shape == (2, 5, 2, 64)
    for given, passed in zip((query, key, value), tileattn_calls["attention"][0]):
        assert passed.data_ptr() == given.data_ptr()
        assert passed.stride() == given.transpose(1, 2).stride()
    expected, _ = attention_reference(*(x.transpose(1, 2) for x in (query, key, value)),
                                      causal=True, softmax_scale=0.125)
    assert relative_error(out, expected) <= TOLERANCES[torch.bfloat16]


@pytest.mark.parametrize("family, padding", [("llama", "none"), ("llama", "left"),
                                             ("mistral", "left"), ("gemma2", "left")])
def test_greedy_generation_matches_eager(family, padding):
    """Prefill then Sq = 1 decode steps against the KV cache agree with eager generation
    (assert_generations_agree: tokens, and each step's logits against float32 eager)."""
    model = make_model(family)
    ids, mask = inputs(padding)
    new_tokens = 3
    generate = dict(max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False,
                    output_logits=True, return_dict_in_generate=True)
    outputs = {}
    for implementation in (NAME, "eager"):
        model.set_attn_implementation(implementation)
        with torch.no_grad():
            outputs[implementation] = model.generate(ids, attention_mask=mask, **generate)
    assert_generations_agree(model, ids, mask, outputs[NAME], outputs["eager"])


def assert_generations_agree(model, ids, mask, got, eager):
    """Decode-step logits within the logits yardstick of float32 eager run on tileattn's
    sequence without a cache; greedy tokens equal, except from a step where eager's own top
    two logits are closer than that tolerance (a near tie either kernel may break)."""
    new_tokens = len(got.logits)
    seqlen = ids.shape[1]
    sequence = got.sequences
    full_mask = torch.cat([mask, mask.new_ones(mask.shape[0], new_tokens)], dim=1)
    position_ids = (full_mask.cumsum(-1) - 1).clamp(min=0)   # as generate numbers the tokens
    dtype = model.dtype
    reference = logits(model.float(), "eager", sequence, full_mask,
                       position_ids=position_ids)[:, seqlen - 1:-1]
    model.to(dtype)
    eager_steps = torch.stack(eager.logits, dim=1).float()
    got_steps = torch.stack(got.logits, dim=1).float()
    bound = 2 * relative_error(eager_steps, reference) + ROUNDING_UNIT[dtype]
    assert relative_error(got_steps, reference) <= bound
    for row in range(sequence.shape[0]):
        differ = (got.sequences[row, seqlen:] != eager.sequences[row, seqlen:]).nonzero()
        if len(differ):
            step = int(differ[0])
            top2 = eager_steps[row, step].topk(2).values
            assert top2[0] - top2[1] <= bound * eager_steps[row, step].norm(), (row, step)


def test_static_cache_generation_uses_only_written_slots():
    """A static cache hands attention all max_cache_len slots; the mask function tells tileattn
    how many are written (no padding: the dense path on a slice, no copy)."""
    model = make_model("llama")
    ids, mask = inputs("none")
    generated = {}
    for implementation in (NAME, "eager"):
        model.set_attn_implementation(implementation)
        with torch.no_grad():
            generated[implementation] = model.generate(
                ids, attention_mask=mask, max_new_tokens=3, min_new_tokens=3, do_sample=False,
                cache_implementation="static", output_logits=True, return_dict_in_generate=True)
    assert_generations_agree(model, ids, mask, generated[NAME], generated["eager"])


def test_packed_sequences_through_position_ids(tileattn_calls):
    """position_ids restarting inside a row (padding-free training batches, no KV cache) split
    the row into independent causal sequences, as transformers' eager mask does."""
    model = make_model("llama")
    ids, _ = inputs("none")
    ids = ids[:1]
    packed = dict(position_ids=torch.tensor([[0, 1, 2, 3, 0, 1, 2, 0, 1, 2, 3]]), use_cache=False)
    got = logits(model, NAME, ids, None, **packed)
    eager = logits(model, "eager", ids, None, **packed)
    reference = logits(model.float(), "eager", ids, None, **packed)
    bound = 2 * relative_error(eager, reference) + ROUNDING_UNIT[torch.bfloat16]
    assert relative_error(got, reference) <= bound
    assert len(tileattn_calls["attention_varlen"]) == model.config.num_hidden_layers


@pytest.mark.parametrize("padding", ["none", "left"])
def test_fp8_opt_in_quantizes_per_head(padding, monkeypatch):
    """register(name, fp8=True): q, k, v quantized to e4m3 with a descale per (batch, head)
    (padded batches: per head over the unpadded tokens, one row per sequence) on every call.
    Each call's output is within the FP8 tolerance (tests/conftest.py) of the fp64 reference on
    the same quantized inputs. Unpadded, the logits are also within twice bf16 eager's distance
    from float32 eager on the same quantized inputs, plus that FP8 tolerance (P in e4m3)."""
    calls = []
    for function in ("attention", "attention_varlen"):
        real = getattr(tileattn, function)
        def recorded(*args, real=real, reference=getattr(tileattn.reference,
                                                          f"{function}_reference"), **options):
            out = real(*args, **options)
            calls.append((args, options, out, reference))
            return out
        monkeypatch.setattr(tileattn, function, recorded)
    name = huggingface.register("tileattn-fp8", fp8=True)
    model = make_model("llama")
    ids, mask = inputs(padding)
    got = logits(model, name, ids, mask)
    assert len(calls) == model.config.num_hidden_layers
    for args, options, out, reference in calls:
        q, k, v = args[:3]
        assert q.dtype == k.dtype == v.dtype == torch.float8_e4m3fn and out.dtype == torch.bfloat16
        assert options["q_descale"].shape == (2, 2) and options["k_descale"].shape == (2, 1)
        positional = args[:5] if len(args) > 3 else args   # varlen: + cu_seqlens_q, cu_seqlens_k
        expected, _ = reference(*positional, causal=True, q_descale=options["q_descale"],
                                k_descale=options["k_descale"], v_descale=options["v_descale"])
        assert relative_error(out, expected) <= TOLERANCES[torch.float8_e4m3fn]
    if padding == "none":
        assert_fp8_logits_close(model, got, ids, mask)


def assert_fp8_logits_close(model, got, ids, mask):
    """FP8 logits within twice bf16 eager's distance from float32 eager on the same quantized
    inputs (q, k, v rounded to e4m3 per head and back), plus the FP8 attention tolerance."""
    from transformers.models.llama.modeling_llama import eager_attention_forward

    def quantized_eager(module, query, key, value, attention_mask, **kwargs):
        def round_trip(x):
            x8, descale = tileattn.quantize_fp8(x.transpose(1, 2), torch.float8_e4m3fn,
                                                per="head")
            return (x8.float() * descale[:, None, :, None]).to(x.dtype).transpose(1, 2)
        return eager_attention_forward(module, round_trip(query), round_trip(key),
                                       round_trip(value), attention_mask, **kwargs)
    transformers.AttentionInterface.register("quantized-eager", quantized_eager)
    transformers.masking_utils.AttentionMaskInterface.register(
        "quantized-eager", ALL_MASK_ATTENTION_FUNCTIONS["eager"])
    dtype = model.dtype
    eager = logits(model, "quantized-eager", ids, mask)
    reference = logits(model.float(), "quantized-eager", ids, mask)
    model.to(dtype)
    bound = 2 * relative_error(eager, reference) + TOLERANCES[torch.float8_e4m3fn]
    assert relative_error(got, reference) <= bound


def test_from_pretrained_and_set_attn_implementation(tmp_path):
    make_model("qwen2").save_pretrained(tmp_path)
    model = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.bfloat16,
                                                              attn_implementation=NAME)
    assert model.config._attn_implementation == NAME
    model.set_attn_implementation("eager")
    model.set_attn_implementation(NAME)
    assert model.config._attn_implementation == NAME


# ---- what falls back, and what is not hidden --------------------------------------------------

def run_falls_back(model, match, **kwargs):
    ids, mask = inputs("left")
    huggingface._WARNED.clear()
    with pytest.warns(huggingface.FallbackWarning, match=match):
        got = logits(model, NAME, ids, mask, **kwargs)
    with warnings.catch_warnings():  # one warning per reason
        logits(model, NAME, ids, mask, **kwargs)
    assert torch.equal(got, logits(model, "eager", ids, mask, **kwargs))


def test_unsupported_head_dim_falls_back_to_eager():
    run_falls_back(make_model("llama", head_dim=32), "head dim 32")


def test_float32_falls_back_outside_autocast_and_runs_tileattn_inside(tileattn_calls):
    run_falls_back(make_model("llama", torch.float32), "dtypes")
    assert not tileattn_calls["attention"] and not tileattn_calls["attention_varlen"]
    model = make_model("llama", torch.float32)
    ids, mask = inputs("none")
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits(model, NAME, ids, mask)
    assert len(tileattn_calls["attention"]) == model.config.num_hidden_layers


def test_output_attentions_falls_back_and_returns_weights():
    model = make_model("llama")
    ids, mask = inputs("none")
    model.set_attn_implementation(NAME)
    huggingface._WARNED.clear()
    with pytest.warns(huggingface.FallbackWarning, match="output_attentions"):
        with torch.no_grad():
            attentions = model(ids, attention_mask=mask, output_attentions=True).attentions
    assert len(attentions) == 2 and attentions[0].shape == (2, 2, SEQLEN, SEQLEN)


def test_training_dropout_falls_back_to_eager():
    ids, mask = inputs("none")
    model = make_model("llama", attention_dropout=0.1).train()
    model.set_attn_implementation(NAME)
    huggingface._WARNED.clear()
    with pytest.warns(huggingface.FallbackWarning, match="dropout"):
        model(ids, attention_mask=mask)


@pytest.mark.parametrize("padding", ["none", "left"])
def test_training_gradients_match_eager(padding, tileattn_calls):
    """A training step through tileattn's backward (attention_varlen's with padding): the
    gradient of every attention projection within twice bf16 eager's distance from float32
    eager, plus one rounding unit."""
    ids, mask = inputs(padding)
    # No loss where a padding position is the query (its output is undefined: eager spreads
    # it uniformly over masked keys, tileattn writes 0): labels are shifted by one.
    labels = ids.clone()
    labels[:, 1:].masked_fill_(mask[:, :-1] == 0, -100)
    model = make_model("llama").train()
    grads = {}
    for implementation, dtype in (("eager", torch.float32), ("eager", torch.bfloat16),
                                  (NAME, torch.bfloat16)):
        model.to(dtype).set_attn_implementation(implementation)
        model.zero_grad()
        model(ids, attention_mask=mask, labels=labels).loss.backward()
        grads[implementation, dtype] = torch.cat([
            getattr(layer.self_attn, name).weight.grad.float().flatten()
            for layer in model.model.layers for name in ("q_proj", "k_proj", "v_proj")])
    used = "attention" if padding == "none" else "attention_varlen"
    assert len(tileattn_calls[used]) == model.config.num_hidden_layers
    reference = grads["eager", torch.float32]
    bound = (2 * relative_error(grads["eager", torch.bfloat16], reference)
             + ROUNDING_UNIT[torch.bfloat16])
    assert relative_error(grads[NAME, torch.bfloat16], reference) <= bound


def test_fp8_training_is_refused_not_hidden():
    """tileattn has no FP8 backward: its refusal reaches the caller unchanged."""
    ids, mask = inputs("none")
    model = make_model("llama").train()
    model.set_attn_implementation(huggingface.register("tileattn-fp8", fp8=True))
    with pytest.raises((TypeError, ValueError), match="requires grad"):
        model(ids, attention_mask=mask, labels=ids)
