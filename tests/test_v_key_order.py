"""Grouped key order for FP8 V (kernels/layout.py; experimental, TILEATTN_FP8_V_KEYS=grouped):
the transpose writes V's keys reordered within groups of 32 with zero padding, and the portable
kernel, reordering P's columns the same way, gives the natural-order result. Runs the real
kernels (the interpreter on CPU)."""

import pytest
import torch

from tileattn import fp8
from tileattn.arch import arch_of
from tileattn.kernels import attention_fwd
from tileattn.kernels.layout import KEY_GROUP, grouped_seqlen, transpose_v_launch

from .test_attention import DEVICE, assert_close_to_reference, make_inputs

E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2


def grouped_position(key: int) -> int:
    """Where key sits in a grouped-order copy: key 16a + 8j + 2q + b of a group of 32 goes to
    position 16a + 4q + 2j + b (written out from the layout's definition)."""
    group, c = divmod(key, KEY_GROUP)
    a, j, q, b = c // 16, (c // 8) % 2, (c // 2) % 4, c % 2
    return group * KEY_GROUP + 16 * a + 4 * q + 2 * j + b


@pytest.mark.parametrize("seqlen", [32, 77, 130])
def test_grouped_transpose_reorders_keys_and_zero_pads(seqlen):
    fused = torch.randn(2, seqlen, 2, 3, 64, device=DEVICE).to(E4M3)
    v = fused[:, :, 1]   # strided, as when sliced from a fused kv buffer
    padded = grouped_seqlen(seqlen)
    out = torch.full((2, 3, 64, padded), float("nan"), device=DEVICE).to(E4M3)   # poisoned
    transpose_v_launch(v, out, group_keys=True).run()
    want = torch.zeros(2, 3, 64, padded, device=DEVICE)
    for key in range(seqlen):
        want[:, :, :, grouped_position(key)] = v[:, key].float()
    assert torch.equal(out.float(), want)
    with pytest.raises(ValueError, match="contiguous"):
        transpose_v_launch(v, out[..., 1:], group_keys=True)


@pytest.mark.parametrize("dtype", [E4M3, E5M2], ids=str)
@pytest.mark.parametrize("shape", [
    (1, 45, 45, 2, 1, 64, 64, True),      # a key group cut by the sequence end
    (2, 37, 77, 2, 2, 64, 64, True),      # Sq < Sk, bottom-right causal
    (1, 64, 100, 2, 2, 128, 128, False),
], ids=lambda s: f"sq{s[1]}-sk{s[2]}-d{s[5]}-{'causal' if s[7] else 'full'}")
def test_grouped_v_matches_natural_order(shape, dtype):
    causal = shape[7]
    q, k, v, descales = make_inputs(shape, dtype)
    arch = arch_of(q.device)
    # BLOCK_N must hold whole groups of 32; the interpreter's own rows use 16.
    config = attention_fwd.TileConfig(32, 32, 4, 1)
    outputs = {}
    for grouped in (False, True):
        v_k_major = fp8.k_major_copy(v, group_keys=grouped)
        out = torch.full((*q.shape[:3], v.shape[3]), float("nan"), dtype=torch.bfloat16,
                         device=q.device)
        lse = torch.empty(q.shape[0], q.shape[2], q.shape[1], device=q.device)
        launch = attention_fwd.attention_launch(
            q, k, v_k_major, out, lse, descales["q_descale"], descales["k_descale"],
            descales["v_descale"], q.shape[3] ** -0.5, causal, arch, v_keys_grouped=grouped,
            config=config)
        launch.run()
        assert_close_to_reference(out, lse, q, k, v, causal, descales)
        outputs[grouped] = out.float()
    # Same math in another summation order: equal up to fp32 rounding before the bf16 store.
    assert torch.allclose(outputs[True], outputs[False], atol=2e-2, rtol=2e-2)


def test_grouped_v_needs_whole_key_groups_per_tile():
    q, k, v, descales = make_inputs((1, 16, 16, 1, 1, 64, 64, False), E4M3)
    out = torch.empty(1, 16, 1, 64, dtype=torch.bfloat16, device=q.device)
    with pytest.raises(ValueError, match="multiple of 32"):
        attention_fwd.attention_launch(q, k, fp8.k_major_copy(v, group_keys=True), out, None,
                                       *descales.values(), 0.125, False, arch_of(q.device),
                                       v_keys_grouped=True,
                                       config=attention_fwd.TileConfig(16, 16, 4, 1))


@pytest.mark.parametrize("setting,grouped", [("grouped", True), (None, False), ("natural", False)])
def test_attention_groups_v_keys_only_when_asked(monkeypatch, setting, grouped):
    """attention() on an sm90 arch row: TILEATTN_FP8_V_KEYS=grouped makes the in-call V copy
    grouped and tells the kernel; otherwise V stays in natural order. The answer is right
    either way."""
    import tileattn
    from tileattn import arch as arch_module
    from tileattn.kernels import interpreter_active
    if not interpreter_active() or DEVICE != "cpu":
        pytest.skip("drives the CPU interpreter with an sm90 arch row")
    seen = {}
    real_launch = attention_fwd.attention_launch

    def spy(q, k, v, *args, v_keys_grouped=False, **kwargs):
        seen["grouped"] = v_keys_grouped
        return real_launch(q, k, v, *args[:-1], arch_module.CPU, v_keys_grouped=v_keys_grouped,
                           config=attention_fwd.TileConfig(32, 32, 4, 1))

    if setting is None:
        monkeypatch.delenv("TILEATTN_FP8_V_KEYS", raising=False)
    else:
        monkeypatch.setenv("TILEATTN_FP8_V_KEYS", setting)
    monkeypatch.setattr("tileattn.api.arch_of", lambda device: arch_module.arch_for_capability((9, 0)))
    monkeypatch.setattr("tileattn.api.kernel_for", lambda *args: "portable")
    monkeypatch.setattr(attention_fwd, "attention_launch", spy)
    shape = (1, 40, 70, 2, 1, 64, 64, True)
    q, k, v, descales = make_inputs(shape, E4M3)
    out, lse = tileattn.attention(q, k, v, causal=True, return_lse=True, **descales)
    assert seen["grouped"] == grouped
    assert_close_to_reference(out, lse, q, k, v, True, descales)


def test_unknown_v_key_order_is_refused(monkeypatch):
    import tileattn
    monkeypatch.setenv("TILEATTN_FP8_V_KEYS", "shuffled")
    q, k, v, descales = make_inputs((1, 8, 8, 1, 1, 64, 64, False), E4M3)
    with pytest.raises(ValueError, match="TILEATTN_FP8_V_KEYS"):
        tileattn.attention(q, k, v, **descales)
