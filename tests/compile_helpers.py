"""Run cross-compilation in a child process without TRITON_INTERPRET.

The test process interprets kernels (conftest sets TRITON_INTERPRET=1 on CPU machines), and an
interpreted kernel cannot be compiled; a clean child process defines them as real JIT kernels.
"""

import json
import os
import subprocess
import sys
import textwrap


def run_without_interpreter(code: str, timeout: float = 900.0):
    """Run `code` in a fresh Python; it must print one JSON document last. Returns it parsed."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env,
                          capture_output=True, text=True, timeout=timeout)
    if done.returncode != 0:
        raise AssertionError(f"child failed ({done.returncode}):\n{done.stderr[-4000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])
