"""Work plans, in plain Python/torch so they can be unit-tested on the CPU.

Two families live here:
  * persistent tile order for prefill attention (one program per SM walks a list of tiles);
  * split-KV plans for MLA decode (how each sequence's keys are cut across SMs).
"""

from __future__ import annotations

# ---- persistent prefill tile order --------------------------------------------------------


# ---- MLA decode split-KV plans ------------------------------------------------------------
