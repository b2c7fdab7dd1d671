"""Summarise a compute-sanitizer racecheck log: hazards counted by (kind, first access, its
source site, its warpgroup = thread // 128, second access, site, warpgroup).

racecheck does not model mbarriers as synchronisation, so in the warp-specialized Gluon kernels
every hand-off between two warpgroups through shared memory (P, alpha, the output scale) shows
up as a hazard; what the summary is for is a hazard whose two accesses are in one warpgroup, or
at a site that no mbarrier orders (docs/design.md, "Safety contract").

    python benchmarks/racecheck_summary.py racecheck.log

(bash benchmarks/gpu.sh racecheck:mla writes $OUT/racecheck.log and prints this summary).
"""

from __future__ import annotations

import argparse
import collections
import re

HAZARD = re.compile(
    r"Potential (\w+) hazard.*?\n=+\s+(\w+) Thread \((\d+),.*? at \S+ in (\S+)\n"
    r"=+\s+(\w+) Thread \((\d+),.*? at \S+ in (\S+)", re.S)


def summarise(text: str) -> list[tuple[int, tuple]]:
    """(count, (kind, access, site, warpgroup, access, site, warpgroup)), most frequent first."""
    counts = collections.Counter()
    for m in HAZARD.finditer(text):
        kind, first, thread_a, site_a, second, thread_b, site_b = m.groups()
        counts[(kind, first, site_a, int(thread_a) // 128, second, site_b,
                int(thread_b) // 128)] += 1
    return [(n, key) for key, n in counts.most_common()]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python benchmarks/racecheck_summary.py",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("log", help="compute-sanitizer --tool racecheck output")
    parser.add_argument("--top", type=int, default=40, help="rows to print")
    args = parser.parse_args(argv)
    text = open(args.log).read()
    for n, key in summarise(text)[:args.top]:
        print(n, key)
    print(*re.findall(r"RACECHECK SUMMARY.*", text), sep="\n")


if __name__ == "__main__":
    main()
