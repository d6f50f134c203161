"""README.md and the user guides in docs/ cannot rot: every ```bash and ```python block of each runs, in order, in a
fresh folder laid out like a checkout (its examples/ and the data beside it, ../shared/data/, are the checkout's;
nothing else), slow since most start by training the demo model. ```text blocks are output, not run. ```sh blocks
install software, which the tests must not do to the machine they run on: README's are checked to be what CI runs
(.ci/run), and the installation guide's are what tests/test_wheel.py does in a fresh virtual environment."""

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers import REPO

GUIDES = sorted(path for path in (REPO / "docs").glob("*.md") if path.name != "ARCHITECTURE.md")
DOCUMENTS = [REPO / "README.md", *GUIDES]
BLOCK = re.compile(r"^```(bash|python)\n(.*?)^```$", re.DOTALL | re.MULTILINE)
INSTALL_BLOCK = re.compile(r"^```sh\n(.*?)^```$", re.DOTALL | re.MULTILINE)
# where a ```sh block (software installation, not run here) may stand
INSTALLING = {"README.md", "installation.md"}


def runnable_blocks(document: Path) -> list[tuple[str, str]]:
    return BLOCK.findall(document.read_text(encoding="utf-8"))


def commands(block: str) -> list[str]:
    """The command lines of a shell block, without comments."""
    lines = (line.split("  #", 1)[0].strip() for line in block.splitlines())
    return [line for line in lines if line and not line.startswith("#")]


def test_every_document_has_blocks_to_run_and_no_unrun_language():
    assert GUIDES, "no user guides in docs/"
    for document in DOCUMENTS:
        text = document.read_text(encoding="utf-8")
        fences = re.findall(r"^```(\w*)$", text, re.MULTILINE)
        allowed = {"bash", "python", "text"} | ({"sh"} if document.name in INSTALLING else set())
        assert set(fences[::2]) <= allowed, f"{document.name}: a block no test runs: {set(fences[::2]) - allowed}"
        assert runnable_blocks(document), f"{document.name} has no block to run"


def test_readme_set_up_commands_are_what_ci_runs():
    """README's install and test commands, line for line, are lines of .ci/run (CI runs them on a clean clone)."""
    ci = {line.split("  #", 1)[0].strip() for line in (REPO / ".ci" / "run").read_text(encoding="utf-8").splitlines()}
    blocks = INSTALL_BLOCK.findall((REPO / "README.md").read_text(encoding="utf-8"))
    assert blocks, "README.md shows no set-up commands"
    documented = [line for block in blocks for line in commands(block)]
    assert "python -m pytest" in documented
    assert not [line for line in documented if line not in ci], ".ci/run does not run README's set-up commands"


DURATION = re.compile(r"\b\d[\d.,]*(?:-\d[\d.,]*)? ?(?:seconds|minutes|min|hours|h|s)\b")
ON_A_CPU = re.compile(r"\bCPUs?\b|\bcores?\b")
CPU_NAMED = re.compile(r"Intel|Xeon|AMD|EPYC|AMX")


def prose_paragraphs(text: str) -> list[str]:
    """A document's paragraphs, list items and table rows, outside its code blocks, each joined onto one line."""
    prose = re.sub(r"^```.*?^```$", "", text, flags=re.DOTALL | re.MULTILINE)
    return [" ".join(part.split()) for part in re.split(r"\n\s*\n|\n(?=\||- )", prose)]


def test_every_duration_measured_on_a_cpu_names_the_cpu():
    """A time on "2 CPU cores" means little when the project's machines differ by 1.2-1.5x (an Intel Xeon, an AMD
    EPYC): each paragraph, list item or table row of README and the guides that gives one names the CPU (issue 75)."""
    unnamed = [f"{document.name}: {paragraph}" for document in DOCUMENTS
               for paragraph in prose_paragraphs(document.read_text(encoding="utf-8"))
               if DURATION.search(paragraph) and ON_A_CPU.search(paragraph) and not CPU_NAMED.search(paragraph)]
    assert not unnamed, "durations on a CPU that do not name it:\n" + "\n".join(unnamed)


def test_readme_is_a_front_door():
    text = (REPO / "README.md").read_text(encoding="utf-8")
    assert len(text.splitlines()) <= 150, "README.md is over 150 lines: move the depth into docs/"
    for guide in GUIDES:
        assert f"docs/{guide.name}" in text, f"README.md does not link docs/{guide.name}"
    assert "RESULTS.md" in text and "BENCHMARKS.md" in text


def test_guides_link_only_to_what_exists():
    for document in DOCUMENTS:
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", document.read_text(encoding="utf-8")):
            if not target.startswith(("http://", "https://")):
                assert (document.parent / target).exists(), f"{document.name} links to a missing {target}"


def test_the_architecture_map_names_every_module():
    """docs/ARCHITECTURE.md opens with a one-screen map of the package; a module missing from it fails here."""
    text = (REPO / "docs" / "ARCHITECTURE.md").read_text(encoding="utf-8")
    the_map = text.split("## The map", 1)[1].split("\n## ", 1)[0]
    package = REPO / "hf_headattn"
    modules = [path for path in package.rglob("*.py") if "evaluate_modules" not in path.parts
               and not (path.name == "__init__.py" and path.parent != package)]
    assert "evaluate_modules/" in the_map
    missing = sorted(str(path.relative_to(package)) for path in modules if path.name not in the_map)
    assert not missing, f"docs/ARCHITECTURE.md's map does not name {missing}"


def checkout_like_folder(tmp_path: Path) -> Path:
    """A fresh folder where the guides' commands run as in a checkout's root: examples/ and ../shared/ resolve."""
    work = tmp_path / "work"
    work.mkdir()
    (work / "examples").symlink_to(REPO / "examples")
    if (REPO.parent / "shared").is_dir():
        (tmp_path / "shared").symlink_to(REPO.parent / "shared")
    return work


@pytest.mark.slow
@pytest.mark.parametrize("document", DOCUMENTS, ids=lambda path: path.name)
def test_document_blocks_run_in_order(document, tmp_path):
    work = checkout_like_folder(tmp_path)
    environment = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(REPO)}
    start = time.perf_counter()
    for number, (language, code) in enumerate(runnable_blocks(document), start=1):
        command = ["bash", "-euo", "pipefail", "-c", code] if language == "bash" else [sys.executable, "-c", code]
        finished = subprocess.run(command, cwd=work, env=environment, capture_output=True, text=True, timeout=1200)
        assert finished.returncode == 0, (f"{document.name}, block {number} ({language}) failed:\n{code}\n"
                                          f"stdout:\n{finished.stdout[-3000:]}\nstderr:\n{finished.stderr[-3000:]}")
    print(f"{document.name}: {len(runnable_blocks(document))} blocks in {time.perf_counter() - start:.0f} s")
