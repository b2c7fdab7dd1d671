"""The prefill/training forward grid of ../shared/BENCHMARKS.md, tileattn beside its peers.

Every implementation gets the same inputs in the public layout [B, N, H, D]; the FP8 rows pass
a row-major V, so the K-major transposition attention() makes on sm89/sm90 is inside the timed
region. Each call is checked against cuDNN/FA2 bf16 of the same point before it is timed; the
columns of a point that pass are timed interleaved over common.ROUNDS rounds
(common.time_interleaved): "ms" is the median of the rounds, "ms_rounds" all of them. The run
goes point by point through runs.GridRun (partial file after each point, a time budget, parts
merged by point with `python -m tileattn bench --merge`).
"""

from __future__ import annotations

import functools
import math
import statistics

import torch
import torch.nn.functional as F

import tileattn

from . import runs
from .common import device_facts, spin_up, time_interleaved

GRID = "prefill"
POINT_FIELDS = ("D", "causal", "N")
BATCH, HEADS = 4, 32
HEAD_DIMS = (64, 128, 256)
CONTEXTS = (1024, 2048, 4096, 8192, 16384, 32768)
FLEX_CONTEXTS = (1024, 4096, 16384)
# Relative L2 distance to the bf16 peer's output that a timed call must stay under.
CHECK_TOLERANCE = {"bf16": 2e-2, "fp16": 2e-2, "fp8e4m3": 1e-1, "fp8e5m2": 1.5e-1}
TILEATTN_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16,
                   "fp8e4m3": torch.float8_e4m3fn, "fp8e5m2": torch.float8_e5m2}
# Extra tileattn columns: "-vT" passes V already K-major, "-portable" forces the portable kernel.
COLUMN_SUFFIXES = ("-vT", "-portable")


def precision(column_dtype: str) -> str:
    """The dtype name of a column ("fp8e4m3-vT" -> "fp8e4m3")."""
    for suffix in COLUMN_SUFFIXES:
        column_dtype = column_dtype.removesuffix(suffix)
    return column_dtype


def flops(context: int, head_dim: int, causal: bool) -> float:
    total = 4 * BATCH * HEADS * context * context * head_dim
    return total / 2 if causal else total


def _sdpa(backend):
    from torch.nn.attention import sdpa_kernel

    def run(q, k, v, causal):  # SDPA wants [B, H, N, D]
        with sdpa_kernel([backend]):
            return F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2),
                                                  v.transpose(1, 2), is_causal=causal).transpose(1, 2)
    return run


def _flex():
    import torch._dynamo
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention
    # The default recompile limit of 8 silently falls back to an unfused path.
    torch._dynamo.config.cache_size_limit = 1000
    compiled = torch.compile(flex_attention, dynamic=False)
    masks = {}

    def run(q, k, v, causal):
        block_mask = None
        if causal:
            key = (q.shape[1], q.device)
            if key not in masks:
                masks[key] = create_block_mask(lambda b, h, qi, ki: qi >= ki, None, None,
                                               q.shape[1], q.shape[1], device=q.device)
            block_mask = masks[key]
        return compiled(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                        block_mask=block_mask).transpose(1, 2)
    return run


def _fa4():
    """FlashAttention-4's bf16 forward (CuTe DSL, on Hopper too), [B, N, H, D]. Optional: its
    wheels travel as ../shared/BENCHMARKS.md says."""
    from flash_attn.cute.interface import flash_attn_func

    def run(q, k, v, causal):
        return flash_attn_func(q, k, v, causal=causal)[0]
    return run


def _cudnn_fp8():
    """cuDNN's FP8 attention through cudnn-frontend (e4m3 in and out, per-tensor scales).

    One graph per (shape, causal), built once; a timed call is graph.execute plus the host
    work of its variant pack. The output comes back as e4m3 scaled by scale_o; the correctness
    check upcasts and descales it, the timed calls do not.
    """
    import cudnn

    handle = cudnn.create_handle()
    graphs = {}
    e4m3, fp32 = cudnn.data_type.FP8_E4M3, cudnn.data_type.FLOAT

    def build(q, k, v, causal):
        graph = cudnn.pygraph(io_data_type=e4m3, intermediate_data_type=fp32,
                              compute_data_type=fp32, handle=handle)
        as_bhsd = lambda x: x.transpose(1, 2)  # cuDNN's logical order, same memory
        tensors = {name: graph.tensor(name=name, dim=list(as_bhsd(x).shape),
                                      stride=list(as_bhsd(x).stride()), data_type=e4m3)
                   for name, x in (("q", q), ("k", k), ("v", v))}
        scalars = {name: graph.tensor(name=name, dim=[1, 1, 1, 1], stride=[1, 1, 1, 1],
                                      data_type=fp32)
                   for name in ("descale_q", "descale_k", "descale_v", "descale_s", "scale_s",
                                "scale_o")}
        out, _, amax_s, amax_o = graph.sdpa_fp8(
            **tensors, **scalars, is_inference=True, attn_scale=1.0 / math.sqrt(q.shape[-1]),
            use_causal_mask=causal)
        out_torch = torch.empty(q.shape[:3] + v.shape[3:], dtype=torch.float8_e4m3fn, device=q.device)
        out.set_output(True).set_dim(list(as_bhsd(out_torch).shape)).set_stride(
            list(as_bhsd(out_torch).stride())).set_data_type(e4m3)
        for amax in (amax_s, amax_o):
            amax.set_output(True).set_dim([1, 1, 1, 1]).set_stride([1, 1, 1, 1]).set_data_type(fp32)
        graph.validate()
        graph.build_operation_graph()
        graph.create_execution_plans([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])
        graph.check_support()
        graph.build_plans()
        workspace = torch.empty(graph.get_workspace_size(), device=q.device, dtype=torch.uint8)
        amax_buffers = [torch.empty(1, 1, 1, 1, device=q.device) for _ in range(2)]
        return graph, tensors, scalars, out, out_torch, (amax_s, amax_o), amax_buffers, workspace

    def run(q, k, v, causal, q_descale, k_descale, v_descale):
        key = (tuple(q.shape), tuple(v.shape), causal)
        if key not in graphs:
            graphs[key] = build(q, k, v, causal)
        graph, tensors, scalars, out, out_torch, amaxes, amax_buffers, workspace = graphs[key]
        values = {"descale_q": q_descale, "descale_k": k_descale, "descale_v": v_descale,
                  "descale_s": torch.tensor(1 / 448.0, device=q.device),
                  "scale_s": torch.tensor(448.0, device=q.device),
                  "scale_o": 1.0 / v_descale}
        pack = {tensors["q"]: q, tensors["k"]: k, tensors["v"]: v, out: out_torch}
        pack.update({scalars[name]: value.reshape(1, 1, 1, 1) for name, value in values.items()})
        pack.update(dict(zip(amaxes, amax_buffers)))
        cudnn.set_stream(handle, torch.cuda.current_stream().cuda_stream)
        graph.execute(pack, workspace, handle=handle)
        return _Descaled(out_torch, v_descale)
    return run


def _portable_attention(q, k, v, causal):
    with tileattn.use_kernels(attention="portable"):
        return tileattn.attention(q, k, v, causal=causal)


def _dispatches_to_portable(q, k, v, causal) -> bool:
    from tileattn import dispatch
    from tileattn.arch import arch_of
    return dispatch.attention_kernel(arch_of(q.device), q, k, v, causal,
                                     dispatch.current()) == "portable"


class _Descaled:
    """cuDNN's e4m3 output with its scale, upcast only when the check reads it."""

    def __init__(self, out_fp8, v_descale):
        self.out_fp8, self.v_descale = out_fp8, v_descale

    def float(self):
        return self.out_fp8.float() * self.v_descale


@functools.cache
def _tileattn(dtype_name):
    """Inputs for one tileattn column; "-vT" passes V already K-major (prepare_v untimed).
    One function a name, so that columns on the same inputs share them (measure)."""
    if dtype_name.endswith("-portable"):
        return _tileattn(precision(dtype_name))
    dtype = TILEATTN_DTYPES[precision(dtype_name)]

    def prepare(q, k, v):
        if dtype.itemsize == 2:
            return (q.to(dtype), k.to(dtype), v.to(dtype)), {}
        (q8, qd), (k8, kd), (v8, vd) = (tileattn.quantize_fp8(x, dtype) for x in (q, k, v))
        if dtype_name.endswith("-vT"):
            v8 = tileattn.prepare_v(v8)
        return (q8, k8, v8), dict(q_descale=qd, k_descale=kd, v_descale=vd)
    return prepare


PEERS = ("cudnn", "fa2", "flex", "fa4")


def providers(peers=PEERS):
    """(impl, dtype) -> (prepare inputs, run): tileattn's columns and those of `peers` that can
    run here (the others are left out, with the reason printed)."""
    from torch.nn.attention import SDPBackend
    table = {}
    for name in (*TILEATTN_DTYPES, "fp8e4m3-vT"):
        table[("tileattn", name)] = (_tileattn(name),
                                     lambda q, k, v, causal, **d: tileattn.attention(q, k, v, causal=causal, **d))
    # Where attention() picks the Hopper kernel, the portable kernel's bf16 time as well (the
    # foundation issue's bars are about the portable kernel).
    table[("tileattn", "bf16-portable")] = (_tileattn("bf16-portable"), _portable_attention)
    bf16 = _tileattn("bf16")
    if "cudnn" in peers:
        table[("cudnn", "bf16")] = (bf16, lambda q, k, v, causal: _sdpa(SDPBackend.CUDNN_ATTENTION)(q, k, v, causal))
        try:
            cudnn_fp8 = _cudnn_fp8()
            table[("cudnn", "fp8e4m3")] = (_tileattn("fp8e4m3"), lambda q, k, v, causal, **d: cudnn_fp8(q, k, v, causal, **d))
        except Exception as error:  # noqa: BLE001 - the wheel is optional (benchmarks/README.md)
            print(f"cudnn-frontend FP8 unavailable: {type(error).__name__}: {error}")
    if "fa2" in peers:
        table[("fa2", "bf16")] = (bf16, lambda q, k, v, causal: _sdpa(SDPBackend.FLASH_ATTENTION)(q, k, v, causal))
    optional = {"flex": _flex, "fa4": _fa4}
    for name in [p for p in peers if p in optional]:
        try:
            peer = optional[name]()
            table[(name, "bf16")] = (bf16, lambda q, k, v, causal, peer=peer: peer(q, k, v, causal))
        except Exception as error:  # noqa: BLE001 - report and go on without the peer
            print(f"{name} unavailable: {type(error).__name__}: {error}")
    return table


def _yardstick(table, q, k, v, causal):
    """A peer's bf16 output (cuDNN, else FA2) that every timed call is compared with."""
    for peer in (("cudnn", "bf16"), ("fa2", "bf16")):
        if peer in table:
            prepare, call = table[peer]
            try:
                args, kwargs = prepare(q, k, v)
                return call(*args, causal, **kwargs).float()
            except Exception:  # noqa: BLE001 - try the next peer
                continue
    raise RuntimeError("no bf16 peer could run to check results against")


def grid_points(head_dims=HEAD_DIMS, contexts=CONTEXTS) -> list[dict]:
    """The grid's points (the whole grid by default), in run order."""
    return [dict(D=d, causal=c, N=n) for d in head_dims for c in (False, True) for n in contexts]


def measure(point: dict, table: dict, device) -> list[dict]:
    """The rows of one point: every column of `table` (providers()) that runs here and passes
    its check, timed interleaved."""
    head_dim, causal, context = point["D"], point["causal"], point["N"]
    gen = torch.Generator(device=device).manual_seed(context + head_dim)
    shape = (BATCH, context, HEADS, head_dim)
    q, k, v = (torch.randn(shape, device=device, generator=gen) for _ in range(3))
    yardstick = _yardstick(table, q, k, v, causal)
    calls, inputs = {}, {}    # inputs: prepare function -> its (args, kwargs), shared by columns
    for (impl, dtype_name), (prepare, call) in table.items():
        if impl == "flex" and context not in FLEX_CONTEXTS:
            continue
        try:
            if prepare not in inputs:
                inputs[prepare] = prepare(q, k, v)
            args, kwargs = inputs[prepare]
            if dtype_name == "bf16-portable" and _dispatches_to_portable(*args, causal):
                continue  # the tileattn-bf16 column already is the portable kernel here
            out = call(*args, causal, **kwargs)
            error = float((out.float() - yardstick).norm() / yardstick.norm())
            del out
        except Exception as error:  # noqa: BLE001 - a peer that fails a shape is reported
            print(f"\n{impl}-{dtype_name} {point}: {type(error).__name__}: {str(error)[:200]}")
            continue
        if not error < CHECK_TOLERANCE[precision(dtype_name)]:
            print(f"\n{impl}-{dtype_name} {point}: error {error:.3g}, not timed")
            continue
        calls[(impl, dtype_name)] = (lambda call=call, args=args, kwargs=kwargs:
                                     call(*args, causal, **kwargs))
    rows = []
    for (impl, dtype_name), times in time_interleaved(calls).items():
        ms = statistics.median(times)
        rows.append({**point, "impl": impl, "dtype": dtype_name, "ms": ms, "ms_rounds": times,
                     "tflops": flops(context, head_dim, causal) / ms / 1e9})
    return rows


def run(out_dir=None, quick=False, head_dims=HEAD_DIMS, contexts=CONTEXTS, peers=PEERS,
        budget_s=None) -> dict:
    """Time the grid (or the points asked for) and write its results file and plot: prefill.json
    once a run, or the merge of parts, covers every point with every peer; else
    prefill-partial.json (a run with fewer peers stays partial)."""
    device = torch.device("cuda")
    table = providers(peers)
    if quick:
        head_dims, contexts = (128,), (1024, 4096)
    grid = runs.GridRun(GRID, device_facts(device), grid_points(head_dims, contexts),
                        grid_points(), POINT_FIELDS, out_dir, budget_s,
                        partial=set(peers) != set(PEERS), batch=BATCH, heads=HEADS)
    spin_up()
    for point in grid:
        grid.add(point, measure(point, table, device))
        torch.cuda.empty_cache()
    path = grid.finish()
    payload = grid.payload()
    print(format_tables(payload))
    print(f"results: {path}")
    plot(payload, path.with_suffix(".png"))
    return payload


def table_columns(rows: list[dict]) -> list[tuple[str, str]]:
    """Every (impl, dtype) column in the rows, tileattn's first: the order of tables and plots."""
    return sorted({(r["impl"], r["dtype"]) for r in rows},
                  key=lambda c: (c[0] != "tileattn", c[0], c[1]))


def format_tables(payload: dict) -> str:
    """One table per (D, causal): TFLOP/s per context and column, then ratios to the best peer."""
    rows = payload["rows"]
    columns = table_columns(rows)
    lines = []
    for head_dim in sorted({r["D"] for r in rows}):
        for causal in (False, True):
            here = [r for r in rows if r["D"] == head_dim and r["causal"] == causal]
            if not here:
                continue
            lines.append(f"\nD={head_dim} causal={causal}  (TFLOP/s)")
            lines.append("N".rjust(6) + "".join(f"{i + '-' + d:>16}" for i, d in columns)
                         + "   tileattn/best-peer bf16, fp8e4m3/bf16 time, fp8 vs cudnn-fp8")
            for context in sorted({r["N"] for r in here}):
                cell = {(r["impl"], r["dtype"]): r for r in here if r["N"] == context}
                text = f"{context:>6}" + "".join(
                    f"{cell[c]['tflops']:>16.0f}" if c in cell else f"{'-':>16}" for c in columns)
                peers = [r["tflops"] for (i, d), r in cell.items() if i != "tileattn" and d == "bf16"]
                ours = cell.get(("tileattn", "bf16"))
                portable = cell.get(("tileattn", "bf16-portable"), ours)
                fp8 = cell.get(("tileattn", "fp8e4m3"))
                cudnn_fp8 = cell.get(("cudnn", "fp8e4m3"))
                if ours and peers:
                    text += f"   {ours['tflops'] / max(peers):.2f}x"
                if ours and fp8:
                    text += f", {fp8['ms'] / ours['ms']:.2f}"
                    if portable is not ours:
                        text += f" ({fp8['ms'] / portable['ms']:.2f} vs portable)"
                if fp8 and cudnn_fp8:
                    text += f", fp8 {fp8['tflops'] / cudnn_fp8['tflops']:.2f}x cudnn-fp8"
                lines.append(text)
    return "\n".join(lines)


README_COLUMNS = (("tileattn", "bf16"), ("tileattn", "bf16-portable"), ("tileattn", "fp8e4m3"),
                  ("tileattn", "fp8e4m3-vT"), ("cudnn", "bf16"), ("cudnn", "fp8e4m3"),
                  ("fa2", "bf16"), ("fa4", "bf16"), ("flex", "bf16"))


def format_markdown(payload: dict, contexts=(1024, 4096, 16384)) -> str:
    """The README's table: TFLOP/s per column at a few contexts, then the issue bars' ratios."""
    rows = payload["rows"]
    header = ([f"{i} {d}" for i, d in README_COLUMNS]
              + ["bf16 vs best peer", "fp8/bf16 time (vs portable)", "fp8 vs cuDNN fp8"])
    lines = ["| D | causal | N | " + " | ".join(header) + " |", "|---" * (3 + len(header)) + "|"]
    for head_dim in sorted({r["D"] for r in rows}):
        for causal in (False, True):
            for context in contexts:
                cell = {(r["impl"], r["dtype"]): r for r in rows
                        if (r["D"], r["causal"], r["N"]) == (head_dim, causal, context)}
                if not cell:
                    continue
                values = [f"{cell[c]['tflops']:.0f}" if c in cell else "-" for c in README_COLUMNS]
                ours, fp8 = cell.get(("tileattn", "bf16")), cell.get(("tileattn", "fp8e4m3"))
                portable = cell.get(("tileattn", "bf16-portable"))
                cudnn_fp8 = cell.get(("cudnn", "fp8e4m3"))
                peers = [r["tflops"] for (i, d), r in cell.items() if i != "tileattn" and d == "bf16"]
                ratio = f"{ours['tflops'] / max(peers):.2f}×" if ours and peers else "-"
                time = "-"
                if ours and fp8:
                    time = f"{fp8['ms'] / ours['ms']:.2f}"
                    if portable:
                        time += f" ({fp8['ms'] / portable['ms']:.2f})"
                versus = f"{fp8['tflops'] / cudnn_fp8['tflops']:.2f}×" if fp8 and cudnn_fp8 else "-"
                lines.append(f"| {head_dim} | {'yes' if causal else 'no'} | {context} | "
                             + " | ".join(values + [ratio, time, versus]) + " |")
    return "\n".join(lines)


def column_styles(columns: list[tuple[str, str]]) -> dict[tuple[str, str], dict]:
    """One line style per column, the same on every panel: colour by the column's place in
    `columns` (all columns of the payload, not of one panel), solid for tileattn, dashed for
    the peers."""
    palette = "tab10" if len(columns) <= 10 else "tab20"
    return {column: dict(color=(palette, index), linestyle="-" if column[0] == "tileattn" else "--",
                         marker="o" if column[0] == "tileattn" else "s")
            for index, column in enumerate(columns)}


def figure(payload: dict):
    """TFLOP/s vs context, one panel per (D, causal), one line per column; one legend for the
    whole figure covering every column (a column missing from a panel keeps its colour on the
    others)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D

    rows = payload["rows"]
    columns = table_columns(rows)
    styles = {}
    for column, style in column_styles(columns).items():
        palette, index = style["color"]
        styles[column] = dict(style, color=plt.get_cmap(palette)(index))
    head_dims = sorted({r["D"] for r in rows})
    fig, axes = plt.subplots(2, len(head_dims), figsize=(5 * len(head_dims), 8.8), squeeze=False)
    for col, head_dim in enumerate(head_dims):
        for row_index, causal in enumerate((False, True)):
            ax = axes[row_index][col]
            here = [r for r in rows if r["D"] == head_dim and r["causal"] == causal]
            for column in columns:
                line = sorted((r["N"], r["tflops"]) for r in here if (r["impl"], r["dtype"]) == column)
                if line:
                    ax.plot([n for n, _ in line], [t for _, t in line], label="-".join(column),
                            markersize=4, **styles[column])
            ax.set_xscale("log", base=2)
            ax.set_title(f"D={head_dim} {'causal' if causal else 'non-causal'}")
            ax.set_xlabel("context")
            ax.set_ylabel("TFLOP/s")
            ax.grid(alpha=0.3)
    handles = [Line2D([], [], label="-".join(column), markersize=4, **styles[column])
               for column in columns]
    fig.legend(handles=handles, loc="lower center", ncol=min(len(columns), 5), fontsize=8,
               frameon=False)
    fig.suptitle(f"{payload['device']} forward, B={payload['batch']} H={payload['heads']} "
                 f"({payload['date']})")
    fig.tight_layout(rect=(0, 0.07, 1, 1))
    return fig


def plot(payload: dict, path) -> None:
    """figure(payload) saved as a PNG at path (skipped, with a note, without matplotlib)."""
    try:
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib not installed (pip install tileattn[bench]): no plot")
        return
    fig = figure(payload)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    print(f"plot: {path}")
