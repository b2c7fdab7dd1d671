"""quantize_qkv_fp8: the Triton kernels (in the interpreter) against their torch mirror, the
round trip, the rotation and smoothing identities, the scales' contract with attention(),
bad inputs, and issue 19's accuracy bar measured in fp64 emulation."""

import math

import pytest
import torch

import tileattn
from tileattn import fp8
from tileattn.bench import fp8_scales
from tileattn.reference import attention_reference

from .conftest import LSE_TOLERANCES, TOLERANCES

E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2
SETTINGS = [dict(per=per, smooth_k=smooth, rotate=rotate)
            for per in ("tensor", "head", "block") for smooth in (False, True)
            for rotate in (False, True)]
SETTINGS += [dict(per="tensor", dtype=E5M2),
             dict(per="block", smooth_k=True, rotate=True, dtype=E5M2)]


def quantize(runs_kernels: bool, *args, **kwargs):
    """quantize_qkv_fp8 through the Triton kernels (interpreter) or the torch mirror."""
    saved = fp8._runs_kernels
    fp8._runs_kernels = lambda device: runs_kernels
    try:
        return tileattn.quantize_qkv_fp8(*args, **kwargs)
    finally:
        fp8._runs_kernels = saved


def grid_inputs(seed=0, seqlen=150):
    """q fp16, k bf16 (GQA 2:1, both D=64), v fp32 (Dv=96, padded in the kernel), 2 tiles of
    rows the second one partial, q strided out of a fused buffer. Entries are multiples of
    1/8 below 2 in magnitude: the float32 sums the kernels and the mirror form for the FP8
    values (rotation, column sums) are then exact whatever their order, so those must agree
    bit for bit. The lse offsets sum products with the mean (a quotient): float32 rounding."""
    gen = torch.Generator().manual_seed(seed)
    grid = lambda *shape: torch.randint(-16, 17, shape, generator=gen) / 8
    fused = grid(1, seqlen, 3, 2, 64).half()
    return fused[:, :, 0], grid(1, seqlen, 1, 64).bfloat16(), grid(1, seqlen, 1, 96)


def normal_inputs(seed=0, seqlen=150):
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(2, seqlen, 2, 64, generator=gen).half(),
            torch.randn(2, seqlen, 1, 64, generator=gen).bfloat16(),
            torch.randn(2, seqlen, 1, 96, generator=gen))


def fp8_codes(x):
    return x.view(torch.uint8).to(torch.int16)


@pytest.mark.parametrize("setting", SETTINGS,
                         ids=lambda s: "-".join(f"{k}={v}" for k, v in s.items()))
def test_kernels_equal_torch_mirror_bit_for_bit(setting):
    q, k, v = grid_inputs()
    kernel = quantize(True, q, k, v, **setting)
    mirror = quantize(False, q, k, v, **setting)
    for got, want in zip(kernel[:3], mirror[:3]):
        assert got.dtype == setting.get("dtype", E4M3)
        assert torch.equal(fp8_codes(got), fp8_codes(want))
    for name, descale in kernel[3].items():
        assert torch.equal(descale, mirror[3][name]), name
    if setting.get("smooth_k"):
        torch.testing.assert_close(kernel[3].lse_offset, mirror[3].lse_offset, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("setting", [dict(per="block", smooth_k=True, rotate=True),
                                     dict(per="tensor", smooth_k=True)], ids=str)
def test_kernels_equal_torch_mirror_up_to_rounding_ties(setting):
    """On arbitrary inputs the float32 sums (rotation, column sums for the mean, row dots)
    add in another order in the kernels, so a value may differ in its last bit; an FP8 code
    then differs only where that value sat on a rounding tie, by one step."""
    q, k, v = normal_inputs()
    kernel = quantize(True, q, k, v, **setting)
    mirror = quantize(False, q, k, v, **setting)
    for got, want in zip(kernel[:3], mirror[:3]):
        steps = (fp8_codes(got) - fp8_codes(want)).abs()
        assert steps.max() <= 1 and (steps > 0).float().mean() < 1e-3
    for name, descale in kernel[3].items():
        torch.testing.assert_close(descale, mirror[3][name], rtol=1e-6, atol=0)
    torch.testing.assert_close(kernel[3].lse_offset, mirror[3].lse_offset, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("per", ["tensor", "head"])
def test_defaults_equal_quantize_fp8(per):
    q, k, v = normal_inputs()
    q8, k8, v8, scales = tileattn.quantize_qkv_fp8(q, k, v, per=per)
    for x, x8, name in ((q, q8, "q_descale"), (k, k8, "k_descale"), (v, v8, "v_descale")):
        want, descale = tileattn.quantize_fp8(x, E4M3, per=per)
        assert torch.equal(fp8_codes(x8), fp8_codes(want)) and torch.equal(scales[name], descale)
    assert scales.lse_offset is None


def unquantized(x8, descale, head_dim, rotated, mean=None):
    """The input as recovered from x8: dequantized, the smoothing mean added back, the
    rotation undone (fp64)."""
    x = fp8.dequantize(x8, descale, torch.float64)
    if mean is not None:
        x = x + mean
    return x @ fp8.rotation_matrix(head_dim).T if rotated else x


@pytest.mark.parametrize("dtype", [E4M3, E5M2], ids=str)
@pytest.mark.parametrize("setting", [dict(per="block"), dict(per="head", rotate=True),
                                     dict(per="block", smooth_k=True, rotate=True)], ids=str)
def test_round_trip_within_fp8_precision(setting, dtype):
    q, k, v = normal_inputs(seqlen=300)
    q = q * torch.tensor([1.0, 30.0], dtype=q.dtype)[None, None, :, None]  # a loud head
    q8, k8, v8, scales = tileattn.quantize_qkv_fp8(q, k, v, dtype, **setting)
    rotated = setting.get("rotate", False)
    k_mean = None
    if setting.get("smooth_k"):
        k_mean = (k.double() @ fp8.rotation_matrix(64)).mean(dim=1, keepdim=True)
    bound = 2**-4 if dtype == E4M3 else 2**-3   # one rounding to 3 (2) mantissa bits
    for x, x8, name, mean in ((q, q8, "q_descale", None), (k, k8, "k_descale", k_mean),
                              (v, v8, "v_descale", None)):
        back = unquantized(x8, scales[name], x.shape[3], rotated and name != "v_descale", mean)
        error = (back - x.double()).norm(dim=(1, 3)) / x.double().norm(dim=(1, 3))
        assert error.max() < bound, (name, error)
    if setting["per"] == "block":
        # Every 128-row block of every head (the last one 44 rows) spans FP8's whole range.
        for start in range(0, 300, 128):
            block_max = q8[:, start:start + 128].float().abs().amax(dim=(1, 3))
            assert torch.all(block_max == torch.finfo(dtype).max), (start, block_max)


@pytest.mark.parametrize("head_dim", [64, 96, 128, 192, 256])
def test_rotation_is_orthogonal_and_keeps_scores(head_dim):
    rotation = fp8.rotation_matrix(head_dim)
    block = fp8.hadamard_block(head_dim)
    assert block == {64: 64, 96: 32, 128: 128, 192: 64, 256: 256}[head_dim]
    assert torch.allclose(rotation @ rotation.T, torch.eye(head_dim, dtype=torch.float64),
                          atol=1e-12)
    entries = rotation.abs()[rotation != 0]
    assert torch.allclose(entries, torch.full_like(entries, block ** -0.5))
    assert torch.equal(rotation, fp8.rotation_matrix(head_dim))   # the fixed seed
    gen = torch.Generator().manual_seed(head_dim)
    q, k = (torch.randn(3, head_dim, generator=gen, dtype=torch.float64) for _ in range(2))
    assert torch.allclose((q @ rotation) @ (k @ rotation).T, q @ k.T, atol=1e-12)


def test_rotation_signs_are_pinned():
    """A changed seed or sign rule would silently break K caches quantized before it."""
    signs = torch.sign(fp8.rotation_matrix(64)[:, 0]).tolist()   # Hadamard column 0 is all +1
    assert [int(s) for s in signs[:12]] == _FIRST_SIGNS_OF_ROTATION_64


_FIRST_SIGNS_OF_ROTATION_64 = [-1, -1, -1, -1, 1, -1, 1, 1, 1, 1, 1, 1]


def test_rotated_kernel_keeps_scores_at_padded_head_dim():
    """D=96 (Hadamard blocks of 32, padded to 128 in the kernel): the quantized rotated q and
    k still give q @ k.T to FP8 precision, and outlier channels no longer set the scale."""
    gen = torch.Generator().manual_seed(1)
    q, k = (torch.randn(1, 40, 2, 96, generator=gen) for _ in range(2))
    q[..., 5] *= 50
    v = torch.randn(1, 40, 2, 64, generator=gen)
    q8, k8, _, scales = tileattn.quantize_qkv_fp8(q, k, v, rotate=True)
    q_back = fp8.dequantize(q8, scales["q_descale"], torch.float64)
    k_back = fp8.dequantize(k8, scales["k_descale"], torch.float64)
    scores = torch.einsum("bqhd,bkhd->bhqk", q_back, k_back)
    exact = torch.einsum("bqhd,bkhd->bhqk", q.double(), k.double())
    assert (scores - exact).norm() / exact.norm() < 0.05
    _, unrotated_descale = tileattn.quantize_fp8(q)
    assert float(scales["q_descale"]) < 0.5 * float(unrotated_descale)   # the outlier spread


def test_smoothing_keeps_the_output_and_true_lse_restores_the_lse():
    """End to end through attention() (the interpreter), keys sharing an offset: smooth_k
    leaves the output what the unsmoothed keys give, only closer (the offset no longer takes
    FP8's bits), shifts the kernel's lse, and scales.true_lse shifts it back."""
    q, k, v = fp8_scales.make_inputs("offset", 1, 45, 2, 64, seed=0)
    exact_out, exact_lse = attention_reference(q, k, v, causal=True)
    errors, lse_errors = {}, {}
    for smooth in (False, True):
        q8, k8, v8, scales = tileattn.quantize_qkv_fp8(q, k, v, per="head", smooth_k=smooth)
        out, lse = tileattn.attention(q8, k8, v8, causal=True, return_lse=True, **scales)
        errors[smooth] = float((out.double() - exact_out).norm() / exact_out.norm())
        lse_errors[smooth] = float((scales.true_lse(lse).double() - exact_lse).abs().max())
        if smooth:
            assert (lse.double() - exact_lse).abs().max() > 5      # the shift true_lse undoes
            k_back = fp8.dequantize(k8, scales["k_descale"], torch.float64)
            assert (k_back.mean(dim=1).abs() < 0.01 * k_back.abs().amax()).all()
    # Measured: output error 0.112 -> 0.041, lse error 0.37 -> 0.047.
    assert errors[True] < 0.5 * errors[False] and lse_errors[True] < 0.5 * lse_errors[False]
    assert lse_errors[True] < 0.1


def test_smoothing_is_softmax_invariant():
    """Shifting every key by one vector m shifts each query's logits by one constant: the
    softmax, hence the output, is the same in fp64; the lse moves by scale * q·m."""
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 30, 2, 64, generator=gen, dtype=torch.float64) for _ in range(3))
    shift = 3 * torch.randn(1, 1, 2, 64, generator=gen, dtype=torch.float64)
    out, lse = attention_reference(q, k, v, causal=True)
    out_shifted, lse_shifted = attention_reference(q, k - shift, v, causal=True)
    # (to 1e-6: the reference reads its inputs as float32)
    assert torch.allclose(out, out_shifted, atol=1e-6)
    offset = torch.einsum("bqhd,bhd->bhq", q, shift[:, 0]) / 8
    assert torch.allclose(lse, lse_shifted + offset, atol=1e-6)


@pytest.mark.parametrize("per", ["tensor", "head", "block"])
def test_scales_shapes_and_dtypes(per):
    q, k, v = normal_inputs(seqlen=37)
    q8, k8, v8, scales = tileattn.quantize_qkv_fp8(q, k, v, per=per)
    shapes = {"tensor": [(), (), ()], "head": [(2, 2), (2, 1), (2, 1)],
              "block": [(2, 2, 1), (2, 1, 1), (2, 1)]}[per]
    assert list(scales) == ["q_descale", "k_descale", "v_descale"]
    assert [tuple(d.shape) for d in scales.values()] == shapes
    assert all(d.dtype == torch.float32 and d.device == q.device for d in scales.values())
    assert (q8.shape, k8.shape, v8.shape) == (q.shape, k.shape, v.shape)
    assert q8.dtype == k8.dtype == v8.dtype == E4M3 and scales.lse_offset is None


def check_attention_takes_the_scales(q, k, v, **setting):
    """attention(q8, k8, v8, causal=True, **scales) against fp64 attention of the dequantized
    inputs (out and lse); returns (lse, scales) for further checks."""
    q8, k8, v8, scales = tileattn.quantize_qkv_fp8(q, k, v, **setting)
    out, lse = tileattn.attention(q8, k8, v8, causal=True, return_lse=True, **scales)
    dequantized = [fp8.dequantize(x, d, torch.float64)
                   for x, d in zip((q8, k8, v8), scales.values())]
    ref, ref_lse = attention_reference(*dequantized, causal=True)
    assert (out.double() - ref).norm() / ref.norm() < TOLERANCES[E4M3]
    lse_error = (lse.double() - ref_lse).abs() / ref_lse.abs().clamp(min=1)
    assert lse_error.max() < LSE_TOLERANCES[E4M3]
    return lse, scales


@pytest.mark.parametrize("per", ["tensor", "head", "block"])
def test_attention_takes_the_scales_as_they_are(per):
    check_attention_takes_the_scales(*normal_inputs(seqlen=37), per=per)


@pytest.mark.parametrize("causal", [False, True])
def test_attention_applies_block_descales_per_tile(causal):
    """Each 128-row block of q and k has its own magnitude (so its own descale), Sq != Sk,
    and the kernel's tiles (the interpreter's are 32 x 16) cover each block several times:
    the output must match fp64 on the dequantized inputs, and one descale per head for the
    same FP8 values (the answer a kernel ignoring the blocks would give) must not."""
    gen = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(1, seqlen, heads, 64, generator=gen)
               for seqlen, heads in ((200, 2), (300, 1), (300, 1)))
    q = q * (4.0 ** (torch.arange(200) // 128))[None, :, None, None]
    k = k * (0.25 ** (torch.arange(300) // 128))[None, :, None, None]
    q8, k8, v8, scales = tileattn.quantize_qkv_fp8(q.bfloat16(), k.bfloat16(), v.bfloat16(),
                                                   per="block")
    assert scales["k_descale"].shape == (1, 1, 3)
    # A strided descale: the kernel follows its strides.
    strided = torch.zeros(1, 1, 6)
    strided[..., ::2] = scales["k_descale"]
    scales = dict(scales, k_descale=strided[..., ::2])
    out = tileattn.attention(q8, k8, v8, causal=causal, **scales)
    ref, _ = attention_reference(q8, k8, v8, causal=causal, **scales)
    error = ((out.double() - ref).norm() / ref.norm()).item()
    assert error < TOLERANCES[E4M3]
    first_blocks = {name: d[..., 0] if d.dim() == 3 else d for name, d in scales.items()}
    wrong, _ = attention_reference(q8, k8, v8, causal=causal, **first_blocks)
    assert ((wrong - ref).norm() / ref.norm()).item() > 10 * TOLERANCES[E4M3]


def test_block_descale_entries_cover_128_rows():
    q, k, v = normal_inputs(seqlen=300)
    q8, k8, v8, scales = tileattn.quantize_qkv_fp8(q, k, v, per="block", block_size=(256, 128))
    assert scales["q_descale"].shape == (2, 2, 3) and scales["k_descale"].shape == (2, 1, 3)
    # A 256-row q block repeats its descale over its two 128-row entries.
    assert torch.equal(scales["q_descale"][..., 0], scales["q_descale"][..., 1])
    assert not torch.equal(scales["k_descale"][..., 0], scales["k_descale"][..., 1])
    rows = fp8.descale_rows(scales["q_descale"], 2, 300, 2)
    assert rows.shape == (2, 300, 2, 1)
    assert torch.equal(rows[:, 255, :, 0], scales["q_descale"][..., 1])
    assert torch.equal(rows[:, 256, :, 0], scales["q_descale"][..., 2])


def test_v_layout_follows_v_k_major():
    q, k, v = normal_inputs()
    _, _, v_row_major, _ = tileattn.quantize_qkv_fp8(q, k, v)
    _, _, v_k_major, _ = tileattn.quantize_qkv_fp8(q, k, v, v_k_major=True)
    assert v_row_major.is_contiguous() and fp8.is_k_major(v_k_major)
    assert torch.equal(fp8_codes(v_row_major), fp8_codes(v_k_major))


@pytest.mark.parametrize("setting", [dict(per="tensor"), dict(per="head", smooth_k=True),
                                     dict(per="block", smooth_k=True, rotate=True)], ids=str)
def test_zero_size_inputs(setting):
    for batch, seqlen_q, seqlen_k in ((0, 5, 5), (1, 0, 5), (1, 5, 0)):
        q = torch.randn(batch, seqlen_q, 2, 64)
        k, v = torch.randn(batch, seqlen_k, 1, 64), torch.randn(batch, seqlen_k, 1, 64)
        q8, k8, v8, scales = tileattn.quantize_qkv_fp8(q, k, v, **setting)
        assert q8.shape == q.shape and k8.shape == k.shape and v8.shape == v.shape
        for name, d in scales.items():
            assert d.dtype == torch.float32 and torch.isfinite(d).all(), name
        if setting["per"] == "block":
            assert scales["q_descale"].shape == (batch, 2, math.ceil(seqlen_q / 128))
        if setting.get("smooth_k"):
            assert scales.lse_offset.shape == (batch, 2, seqlen_q)
            if seqlen_k == 0:   # no key, no mean
                assert torch.all(scales.lse_offset == 0)


NAN, INF = float("nan"), float("inf")
NON_FINITE_CASES = [  # each pass that reports non-finite values, each tensor, each value
    ("q", NAN, dict(per="tensor")), ("v", -INF, dict(per="tensor")),            # statistics
    ("k", INF, dict(per="block")), ("q", NAN, dict(per="block")),               # own scale
    ("k", NAN, dict(per="head", smooth_k=True, rotate=True)),                   # column stats
    ("k", -INF, dict(per="head", smooth_k=True, rotate=True)),
    ("q", INF, dict(per="head", smooth_k=True, rotate=True)),                   # rotated
]


@pytest.mark.filterwarnings("ignore::RuntimeWarning")   # numpy, inside the interpreter
@pytest.mark.parametrize("name,bad,setting", NON_FINITE_CASES, ids=str)
def test_non_finite_inputs_are_named(name, bad, setting):
    tensors = dict(zip("qkv", normal_inputs(seqlen=140)))
    tensors[name][1, 131, 0, 7] = bad
    with pytest.raises(ValueError, match=f"^{name} holds NaN or Inf"):
        tileattn.quantize_qkv_fp8(tensors["q"], tensors["k"], tensors["v"], **setting)


def _inputs(**shape):
    sizes = dict(batch=1, seqlen=8, q_heads=2, kv_heads=1, head_dim=64, head_dim_v=64,
                 dtype=torch.float16) | shape
    q = torch.randn(sizes["batch"], sizes["seqlen"], sizes["q_heads"], sizes["head_dim"])
    k = torch.randn(1, 8, sizes["kv_heads"], 64)
    v = torch.randn(1, 8, sizes["kv_heads"], sizes["head_dim_v"])
    return tuple(x.to(sizes["dtype"]) for x in (q, k, v))


BAD_INPUTS = {
    "q not a tensor": (lambda: ([1.0], *_inputs()[1:]), {}, TypeError, "q must be a torch.Tensor"),
    "k wrong rank": (lambda: (_inputs()[0], _inputs()[1][0], _inputs()[2]), {}, ValueError, "k must have 4 dimensions"),
    "fp8 input": (lambda: _inputs(dtype=E4M3), {}, TypeError, "q must be float16, bfloat16 or float32"),
    "int input": (lambda: (*_inputs()[:2], _inputs()[2].int()), {}, TypeError, "v must be float16"),
    "batch mismatch": (lambda: (_inputs(batch=2)[0], *_inputs()[1:]), {}, ValueError, "batch sizes differ"),
    "k/v seqlen mismatch": (lambda: (*_inputs()[:2], torch.randn(1, 9, 1, 64)), {}, ValueError, "v must have k's seqlen"),
    "k/v heads mismatch": (lambda: (*_inputs()[:2], torch.randn(1, 8, 2, 64)), {}, ValueError, "v must have k's number of heads"),
    "heads not a multiple": (lambda: _inputs(q_heads=3, kv_heads=2), {}, ValueError, "multiple of k's heads"),
    "q/k head_dim mismatch": (lambda: (_inputs(head_dim=128)[0], *_inputs()[1:]), {}, ValueError, "k must have q's head_dim"),
    "head_dim too large": (lambda: _inputs(head_dim_v=512), {}, ValueError, "v head_dim must be in 1..256"),
    "dtype not fp8": (_inputs, {"dtype": torch.float16}, TypeError, "dtype must be torch.float8"),
    "per unknown": (_inputs, {"per": "token"}, ValueError, "per must be one of"),
    "smooth_k not bool": (_inputs, {"smooth_k": 1}, TypeError, "smooth_k must be a bool"),
    "rotate not bool": (_inputs, {"rotate": "yes"}, TypeError, "rotate must be a bool"),
    "v_k_major not bool": (_inputs, {"v_k_major": 0}, TypeError, "v_k_major must be a bool or None"),
    "rotate odd head_dim": (lambda: (torch.randn(1, 8, 2, 80),) * 2 + (torch.randn(1, 8, 2, 64),), {"rotate": True}, ValueError, "rotate=True needs a q/k head_dim"),
    "block_size without block": (_inputs, {"block_size": 128}, ValueError, "block_size applies only to per='block'"),
    "block_size not multiple": (_inputs, {"per": "block", "block_size": 64}, ValueError, "block_size must be a positive multiple of 128"),
    "block_size pair not multiple": (_inputs, {"per": "block", "block_size": (128, 192)}, ValueError, "block_size must be a positive multiple"),
    "block_size zero": (_inputs, {"per": "block", "block_size": 0}, ValueError, "block_size must be a positive multiple"),
    "block_size float": (_inputs, {"per": "block", "block_size": 128.0}, TypeError, "block_size must be an int"),
    "block_size triple": (_inputs, {"per": "block", "block_size": (128, 128, 128)}, TypeError, "block_size must be an int"),
    "block_size bool": (_inputs, {"per": "block", "block_size": True}, TypeError, "block_size must be an int"),
    "meta device": (lambda: (torch.randn(1, 8, 2, 64, device="meta"),) * 3, {}, ValueError, "q must be on a CUDA device or the CPU"),
    "requires grad": (lambda: (_inputs(dtype=torch.float32)[0].requires_grad_(), *_inputs()[1:]), {}, ValueError, "q requires grad"),
}


@pytest.mark.parametrize("case", list(BAD_INPUTS), ids=list(BAD_INPUTS))
def test_bad_inputs_name_the_argument(case):
    make, kwargs, error, message = BAD_INPUTS[case]
    with pytest.raises(error, match=message.replace("(", r"\(").replace("[", r"\[")):
        tileattn.quantize_qkv_fp8(*make(), **kwargs)


def test_accuracy_bar_outliers_block_smooth_rotate(monkeypatch):
    """Issue 19's bar: on inputs with outlier channels in q and k and a shared offset in k,
    per-block scales with K smoothing and rotation reach at most 0.4x the per-tensor error
    (relative L2 against fp64 attention of the unquantized inputs, P rounded to e4m3 as the
    portable kernel does; measured 0.25x on this seed). On plain inputs they cost nothing.
    Quantized by the torch mirror, which the tests above hold bit-identical to the kernels."""
    monkeypatch.setattr(fp8, "_runs_kernels", lambda device: False)
    shape = dict(batch=1, seqlen=256, heads=2, head_dim=128, seed=0, kernel=False,
                 p_roundings=("exact", "e4m3"))
    errors = {(kind, setting): fp8_scales.measure(kind, setting, **shape)
              for kind in ("outliers", "plain") for setting in ("tensor", "block+smooth+rotate")}
    for rounding in ("exact", "e4m3"):
        best = errors["outliers", "block+smooth+rotate"][rounding]
        assert best <= 0.4 * errors["outliers", "tensor"][rounding], errors
        plain = errors["plain", "block+smooth+rotate"][rounding]
        assert plain <= 1.1 * errors["plain", "tensor"][rounding]
    assert 0.2 < errors["outliers", "tensor"]["e4m3"] < 0.5   # the outliers do hurt per tensor
