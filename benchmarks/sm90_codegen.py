"""Cross-compile every config row of the Gluon (sm90) kernels and compare the generated code
between two versions of the source: proof that a refactor left the instructions unchanged.

    # at the old commit (e.g. a `git worktree` of it), then at the new one
    PYTHONPATH=OLD python benchmarks/sm90_codegen.py dump /tmp/before
    PYTHONPATH=NEW python benchmarks/sm90_codegen.py dump /tmp/after
    python benchmarks/sm90_codegen.py compare /tmp/before /tmp/after

`dump` writes <case>.ptx and <case>.sass (cuobjdump -sass of the cubin) per case; needs
TRITON_INTERPRET unset and no GPU. `compare` prints one verdict per case, the first that
holds of:
  identical      the SASS instruction text is the same, line for line (addresses and
                 encodings stripped; branch targets kept);
  params-renamed the same after a one-to-one renaming of kernel-parameter constant-bank
                 offsets (c[0x0][0x210] and up; sm90 puts kernel parameters there), which
                 removing or reordering kernel parameters shifts;
  regs-renamed   the same after a one-to-one renaming of registers (R, UR, P, UP), per
                 function, in order of first use, on top of the above;
  DIFFERENT      none of these: the instruction sequences differ (a unified diff follows).
                 "DIFFERENT (immediates, NOPs)" says that the difference vanishes when every
                 immediate (shared-memory offsets, branch targets, constants) is masked and
                 NOPs are dropped: same instructions, other addresses. Still a difference; the
                 line after it counts the changed immediates by how much they moved (e.g.
                 "imm -0x10 x46": 46 immediates 16 lower, as when every shared-memory offset
                 past some buffer moves down) and the NOPs before and after.
The PTX is compared the same way (parameter names and virtual registers renamed one to one,
parameter declarations dropped) and its verdict printed beside the SASS one.
"""

from __future__ import annotations

import difflib
import inspect
import os
import pathlib
import re
import subprocess
import sys
import tempfile


# ---- cases ------------------------------------------------------------------------------------

def attention_cases():
    """name -> zero-argument function building the KernelLaunch: every 16-bit config row (D 64,
    128, 256; causal or not; ping-pong and lockstep consumers) and the padded / unequal head
    dims, in bf16 and fp16; and all sizes 1 (arguments folded to constants, no lse)."""
    import dataclasses
    import torch
    from tileattn.kernels.attention import sm90

    takes_descales = "q_descale" in inspect.signature(sm90.attention_sm90_launch).parameters
    takes_is_fp8 = "is_fp8" in inspect.signature(sm90.config_for).parameters

    def launch(dtype, head_dim, head_dim_v, causal, split, ones=False):
        # ones: every size 1 (one query, one key, one head, no lse), so that Triton folds the
        # integer arguments equal to 1 into constants and lse_ptr is None.
        sizes = (1, 1, 1, 1, 1) if ones else (2, 1000, 1024, 4, 2)
        batch, seqlen_q, seqlen_k, heads, kv_heads = sizes
        q = torch.empty(batch, seqlen_q, heads, head_dim, dtype=dtype)
        k = torch.empty(batch, seqlen_k, kv_heads, head_dim, dtype=dtype)
        v = torch.empty(batch, seqlen_k, kv_heads, head_dim_v, dtype=dtype)
        out = torch.empty(batch, seqlen_q, heads, head_dim_v, dtype=dtype)
        lse = None if ones else torch.empty(batch, heads, seqlen_q)
        config = (sm90.config_for(head_dim, head_dim_v, False) if takes_is_fp8
                  else sm90.config_for(head_dim, head_dim_v))
        config = dataclasses.replace(config, split=split)
        descales = (None, None, None) if takes_descales else ()
        return sm90.attention_sm90_launch(q, k, v, out, lse, *descales, 0.1, causal,
                                          config=config, num_programs=132)

    cases = {}
    dims = [(64, 64), (128, 128), (256, 256), (96, 96), (192, 128), (192, 192), (128, 64),
            (64, 256)]
    for dtype, dtype_name in ((torch.bfloat16, "bf16"), (torch.float16, "fp16")):
        for head_dim, head_dim_v in dims:
            for causal in (False, True):
                for split in (True, False):
                    name = (f"attn-{dtype_name}-D{head_dim}-Dv{head_dim_v}-"
                            f"{'causal' if causal else 'full'}-"
                            f"{'pingpong' if split else 'lockstep'}")
                    cases[name] = (lambda a=(dtype, head_dim, head_dim_v, causal, split):
                                   launch(*a))
    for causal in (False, True):
        for split in (True, False):
            name = (f"attn-bf16-D128-Dv128-ones-{'causal' if causal else 'full'}-"
                    f"{'pingpong' if split else 'lockstep'}")
            cases[name] = lambda a=(torch.bfloat16, 128, 128, causal, split): launch(*a, ones=True)
    return cases


def mla_cases():
    """name -> launch builder: H 32/64/128 x q_len 1/2 x bf16/fp16, for a 16-bit cache and an
    e4m3 cache (with and without a descale)."""
    import torch
    from tileattn import scheduler
    from tileattn.arch import arch_for_capability
    from tileattn.kernels.mla import decode as mla, sm90 as mla_sm90, sm90_fp8 as mla_sm90_fp8

    sm90 = arch_for_capability((9, 0))

    def launch(num_heads, q_len, dtype, kv_dtype, descale):
        batch, lengths, page_size = 2, [200, 100], 64
        q = torch.empty(batch, q_len, num_heads, 576, dtype=dtype)
        kv = torch.empty(8, page_size, 576, dtype=kv_dtype)
        page_table = torch.zeros(batch, 4, dtype=torch.int32)
        seq_lens = torch.tensor(lengths, dtype=torch.int32)
        config = mla.config_for(sm90, None, num_heads * q_len)
        plan = scheduler.make_mla_plan(
            lengths, num_heads=num_heads, q_len=q_len, page_size=page_size, kv_dtype=kv.dtype,
            head_dim_v=512, programs_per_item=mla.programs_per_work_item(config, num_heads * q_len),
            num_sms=132, block_n=config.block_n, min_chunk=64, device="cpu", config=config,
            kernel="gluon")
        out = torch.empty(batch, q_len, num_heads, 512, dtype=dtype)
        lse = torch.empty(batch, q_len, num_heads)
        if kv_dtype == torch.float8_e4m3fn:
            kv_descale = torch.ones((), dtype=torch.float32) if descale else None
            return mla_sm90_fp8.mla_sm90_fp8_launch(q, kv, page_table, seq_lens, kv_descale, out,
                                                    lse, plan, 0.1)
        return mla_sm90.mla_sm90_launch(q, kv, page_table, seq_lens, out, lse, plan, 0.1)

    cases = {}
    for dtype, dtype_name in ((torch.bfloat16, "bf16"), (torch.float16, "fp16")):
        for num_heads in (32, 64, 128):
            for q_len in (1, 2):
                for kv_dtype, descale, cache in ((dtype, False, "kv16"),
                                                 (torch.float8_e4m3fn, True, "e4m3"),
                                                 (torch.float8_e4m3fn, False, "e4m3-nodescale")):
                    if cache == "e4m3-nodescale" and (num_heads, q_len) != (64, 1):
                        continue
                    name = f"mla-{dtype_name}-h{num_heads}-q{q_len}-{cache}"
                    cases[name] = (lambda a=(num_heads, q_len, dtype, kv_dtype, descale):
                                   launch(*a))
    return cases


# ---- dump -------------------------------------------------------------------------------------

def _cuobjdump() -> str:
    import triton
    return os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")


def dump(out_dir: pathlib.Path, pattern: str = "") -> None:
    if os.environ.get("TRITON_INTERPRET"):
        sys.exit("unset TRITON_INTERPRET: interpreted kernels cannot be compiled")
    from tileattn.kernels.compile import cross_compile_sm90

    out_dir.mkdir(parents=True, exist_ok=True)
    cases = {**attention_cases(), **mla_cases()}
    for name, build in cases.items():
        if pattern not in name:
            continue
        compiled = cross_compile_sm90(build(), 90)
        (out_dir / f"{name}.ptx").write_text(compiled.asm["ptx"])
        with tempfile.NamedTemporaryFile(suffix=".cubin") as cubin:
            cubin.write(compiled.asm["cubin"])
            cubin.flush()
            sass = subprocess.run([_cuobjdump(), "-sass", cubin.name], capture_output=True,
                                  text=True, check=True).stdout
        (out_dir / f"{name}.sass").write_text(sass)
        print(name, compiled.metadata.shared, flush=True)


# ---- compare ----------------------------------------------------------------------------------

_SASS_LINE = re.compile(r"^\s*/\*[0-9a-f]{4,}\*/\s*(.*?)\s*;?\s*/\*\s*0x[0-9a-f]+\s*\*/\s*$")
_PARAM_OFFSET = re.compile(r"c\[0x0\]\[(0x[0-9a-f]+)\]")
_SASS_REGISTER = re.compile(r"\b(U?R(?:\d+|Z)|U?P(?:\d+|T))\b")


def _rename(lines: list[str], pattern: re.Pattern, keep=lambda token: False,
            group: int = 0) -> list[str]:
    """Rename each distinct match of pattern, in order of first appearance, to a running
    number (per kind prefix): a one-to-one renaming, so two texts compare equal after it only
    if they are equal up to a consistent relabelling."""
    names: dict[str, str] = {}
    counters: dict[str, int] = {}

    def substitute(match: re.Match) -> str:
        token = match.group(group)
        if keep(token):
            return match.group(0)
        if token not in names:
            kind = re.sub(r"[\d]+$", "", token) if group == 0 else "param"
            counters[kind] = counters.get(kind, 0) + 1
            names[token] = f"{kind}#{counters[kind]}"
        return match.group(0).replace(token, names[token])

    return [pattern.sub(substitute, line) for line in lines]


def sass_functions(text: str) -> dict[str, list[str]]:
    """Function name -> its instruction lines, addresses and encodings stripped."""
    functions: dict[str, list[str]] = {}
    current = None
    for line in text.splitlines():
        header = re.match(r"\s*Function : (\S+)", line)
        if header:
            current = functions.setdefault(header.group(1), [])
            continue
        instruction = _SASS_LINE.match(line)
        if instruction and current is not None and instruction.group(1):
            current.append(re.sub(r"\s+", " ", instruction.group(1)))
    return functions


def _is_param(offset_token: str) -> bool:
    return int(offset_token, 16) >= 0x210


def sass_levels(text: str) -> list[list[str]]:
    """The SASS at each normalisation level: raw, params renamed, registers renamed."""
    functions = sass_functions(text)
    raw = [f"== {name}" for name in functions] + sum(functions.values(), [])
    params = []
    registers = []
    for name, lines in functions.items():
        renamed = _rename(lines, _PARAM_OFFSET, keep=lambda t: not _is_param(t), group=1)
        params += [f"== {name}"] + renamed
        registers += [f"== {name}"] + _rename(renamed, _SASS_REGISTER)
    return [raw, params, registers]


def ptx_levels(text: str) -> list[list[str]]:
    """The PTX at each level: raw (source-line debug info dropped); parameter declarations
    dropped and parameter names renamed; virtual registers renamed."""
    text = text.split(".section\t.debug")[0].split(".section .debug")[0]
    lines = [line.strip() for line in text.splitlines()
             if line.strip() and not line.strip().startswith(("//", ".loc", ".file", "$L__tmp",
                                                              "$L__func"))]
    body = [line for line in lines if not re.match(r"\.param\s", line)]
    params = _rename(body, re.compile(r"\b\w+_param_(\d+)\b"), group=1)
    registers = _rename(params, re.compile(r"%[a-z]+\d+"))
    return [lines, params, registers]


VERDICTS = ["identical", "params-renamed", "regs-renamed"]


def _mask_immediates(lines: list[str]) -> list[str]:
    return [re.sub(r"0x[0-9a-f]+", "IMM", line) for line in lines if line != "NOP"]


def immediate_shifts(before: list[str], after: list[str]) -> str:
    """For two instruction lists equal up to immediates and NOPs: how the immediates moved."""
    shifts: dict[str, int] = {}
    old_code = [line for line in before if line != "NOP"]
    new_code = [line for line in after if line != "NOP"]
    for old, new in zip(old_code, new_code):
        for a, b in zip(re.findall(r"0x[0-9a-f]+", old), re.findall(r"0x[0-9a-f]+", new)):
            if a != b:
                kind = "branch target" if "BRA " in old else "imm"
                key = f"{kind} {int(b, 16) - int(a, 16):+#x}"
                shifts[key] = shifts.get(key, 0) + 1
    nops = f"NOPs {before.count('NOP')} -> {after.count('NOP')}"
    return ", ".join([f"{key} x{count}" for key, count in sorted(shifts.items())] + [nops])


def verdict(before: list[list[str]], after: list[list[str]]) -> tuple[str, list[str]]:
    for name, old, new in zip(VERDICTS, before, after):
        if old == new:
            return name, []
    diff = list(difflib.unified_diff(before[-1], after[-1], "before", "after", lineterm="", n=2))
    if _mask_immediates(before[-1]) == _mask_immediates(after[-1]):
        return "DIFFERENT (immediates, NOPs)", [immediate_shifts(before[-1], after[-1])]
    return "DIFFERENT", diff


def compare(before_dir: pathlib.Path, after_dir: pathlib.Path, show: int = 40) -> int:
    names = sorted(p.stem for p in before_dir.glob("*.sass"))
    failures = 0
    print(f"{'case':52s} {'SASS':28s} {'PTX':15s} SASS instructions")
    for name in names:
        after_sass = after_dir / f"{name}.sass"
        if not after_sass.exists():
            print(f"{name:52s} missing")
            failures += 1
            continue
        sass_before = sass_levels((before_dir / f"{name}.sass").read_text())
        sass_after = sass_levels(after_sass.read_text())
        sass_verdict, sass_diff = verdict(sass_before, sass_after)
        ptx_verdict, _ = verdict(ptx_levels((before_dir / f"{name}.ptx").read_text()),
                                 ptx_levels((after_dir / f"{name}.ptx").read_text()))
        count = sum(not line.startswith("== ") for line in sass_after[0])
        print(f"{name:52s} {sass_verdict:28s} {ptx_verdict:15s} {count}")
        if sass_verdict.startswith("DIFFERENT"):
            failures += 1
            print("    " + "\n    ".join(sass_diff[:show]))
    return failures


if __name__ == "__main__":
    command = sys.argv[1] if len(sys.argv) > 1 else ""
    if command == "dump" and len(sys.argv) in (3, 4):
        dump(pathlib.Path(sys.argv[2]), sys.argv[3] if len(sys.argv) == 4 else "")
    elif command == "compare" and len(sys.argv) == 4:
        sys.exit(1 if compare(pathlib.Path(sys.argv[2]), pathlib.Path(sys.argv[3])) else 0)
    else:
        sys.exit(__doc__)
