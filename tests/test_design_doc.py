"""docs/design.md is the one place for measured decisions: short, and every pointer to it from
the code, and every results file it cites, must resolve."""

import pathlib
import re
import subprocess

import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]
DESIGN = REPO / "docs" / "design.md"
DELETED_AT = "2b9d93e"   # the last commit holding the per-run results files (the default "at")


def _headings() -> set[str]:
    return {line.lstrip("#").strip() for line in DESIGN.read_text().splitlines()
            if line.startswith("#")}


def _pointers() -> list[tuple[str, str]]:
    """(file, section) for every `docs/design.md, "<section>"` in the code, tests and scripts;
    a pointer may wrap onto the next comment or docstring line."""
    found = []
    for path in [*REPO.glob("tileattn/**/*.py"), *REPO.glob("tests/**/*.py"),
                 *REPO.glob("benchmarks/*.py"), *REPO.glob("benchmarks/*.md")]:
        text = re.sub(r"\s*\n\s*#?\s*", " ", path.read_text())
        found += [(str(path.relative_to(REPO)), section)
                  for section in re.findall(r'docs/design\.md, "([^"<]+)"', text)]
    return found


def test_the_design_document_replaces_the_journal():
    assert not (REPO / "benchmarks" / "NOTES.md").exists()
    assert len(DESIGN.read_text().splitlines()) <= 300


def test_every_pointer_names_a_section():
    pointers = _pointers()
    assert len(pointers) >= 15
    missing = [(path, section) for path, section in pointers if section not in _headings()]
    assert not missing, missing


def test_cited_canonical_results_exist():
    cited = set(re.findall(r"`results/(\w+/\w+\.json)`", DESIGN.read_text()))
    assert cited
    for name in cited:
        assert (REPO / "benchmarks" / "results" / name).is_file(), name


def _cited_files(text: str) -> list[tuple[str, str]]:
    """(path, commit) of every backticked results path or benchmarks/ path in text: the commit is
    the one named by the first "at <commit>" within the next lines (several paths may share
    it), else DELETED_AT."""
    cited = []
    for match in re.finditer(r"`(2026-[^`]+|benchmarks/[^`]+)`", text):
        if "<" in match.group(1):
            continue
        at = re.search(r"\bat ([0-9a-f]{7,40})\b", text[match.end():match.end() + 300])
        cited.append((match.group(1), at.group(1) if at else DELETED_AT))
    return cited


def test_citations_find_their_commit():
    text = "`2026-a.json` and `2026-b.json` at 23ef787; `benchmarks/x.py`, `2026-c.json` at 2b9d93e"
    assert _cited_files(text) == [("2026-a.json", "23ef787"), ("2026-b.json", "23ef787"),
                                  ("benchmarks/x.py", "2b9d93e"), ("2026-c.json", "2b9d93e")]


def test_cited_deleted_runs_exist_at_their_commit():
    cited = _cited_files(DESIGN.read_text())
    try:
        for commit in {commit for _, commit in cited}:
            subprocess.run(["git", "-C", str(REPO), "cat-file", "-e", f"{commit}^{{commit}}"],
                           check=True, capture_output=True)
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("no git history with the cited commits here")
    assert len(cited) >= 25
    for path, commit in cited:
        full = path if path.startswith("benchmarks/") else f"benchmarks/results/{path}"
        if full.startswith("benchmarks/") and (REPO / full).exists():
            continue   # a file still in the tree (a maintained script)
        done = subprocess.run(["git", "-C", str(REPO), "cat-file", "-e",
                               f"{commit}:{full.rstrip('/')}"], capture_output=True)
        assert done.returncode == 0, f"{full} is not in {commit}"
