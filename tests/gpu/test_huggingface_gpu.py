"""tileattn as transformers' attention backend on CUDA: the tiny models of
tests/test_huggingface.py (Llama, Qwen2, Mistral with a sliding window, Gemma-2 with softcap)
with head dim 128 and sequences of hundreds of tokens, against eager with the same yardstick
(twice eager's own error in bf16 against float32 eager, plus one rounding unit). On the CPU the
same tests run the kernels in the interpreter at 11 tokens; here they compile for the GPU."""

from __future__ import annotations

import warnings

import pytest
import torch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
transformers = pytest.importorskip("transformers")

from tileattn.integrations import huggingface  # noqa: E402

from ..test_huggingface import (CONFIGS, NAME, assert_close_to_eager,  # noqa: E402
                                assert_fp8_logits_close, assert_generations_agree, inputs,
                                logits, make_model)

SEQLEN, PAD = 333, 41          # the sliding windows (4) and 128-key tiles are far shorter
LARGER = dict(head_dim=128, hidden_size=256)


@pytest.fixture(autouse=True)
def fallback_is_an_error():
    with warnings.catch_warnings():
        warnings.simplefilter("error", huggingface.FallbackWarning)
        yield


@pytest.mark.parametrize("family", list(CONFIGS))
@pytest.mark.parametrize("padding", ["none", "left", "right"])
def test_logits_match_eager(family, padding):
    model = make_model(family, device="cuda", **LARGER)
    ids, mask = inputs(padding, SEQLEN, PAD, device="cuda")
    assert_close_to_eager(model, ids, mask, torch.bfloat16)


@pytest.mark.parametrize("family, padding", [("llama", "none"), ("llama", "left"),
                                             ("mistral", "left"), ("gemma2", "left")])
def test_greedy_generation_matches_eager(family, padding):
    model = make_model(family, device="cuda", **LARGER)
    ids, mask = inputs(padding, SEQLEN, PAD, device="cuda")
    generated = {}
    for implementation in (NAME, "eager"):
        model.set_attn_implementation(implementation)
        with torch.no_grad():
            generated[implementation] = model.generate(
                ids, attention_mask=mask, max_new_tokens=8, min_new_tokens=8, do_sample=False,
                output_logits=True, return_dict_in_generate=True)
    assert_generations_agree(model, ids, mask, generated[NAME], generated["eager"])


def test_static_cache_generation():
    model = make_model("llama", device="cuda", **LARGER)
    ids, mask = inputs("none", SEQLEN, PAD, device="cuda")
    generated = {}
    for implementation in (NAME, "eager"):
        model.set_attn_implementation(implementation)
        with torch.no_grad():
            generated[implementation] = model.generate(
                ids, attention_mask=mask, max_new_tokens=8, min_new_tokens=8, do_sample=False,
                cache_implementation="static", output_logits=True, return_dict_in_generate=True)
    assert_generations_agree(model, ids, mask, generated[NAME], generated["eager"])


def test_fp8_opt_in():
    name = huggingface.register("tileattn-fp8", fp8=True)
    model = make_model("llama", device="cuda", **LARGER)
    ids, mask = inputs("none", SEQLEN, PAD, device="cuda")
    assert_fp8_logits_close(model, logits(model, name, ids, mask), ids, mask)
