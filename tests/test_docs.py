"""The user guides in docs/ cannot rot: every ```bash and ```python block of each guide runs, in order, in a fresh
folder (slow: the guides start by training the demo model). ```text blocks are output, not run."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import REPO

GUIDES = sorted(path for path in (REPO / "docs").glob("*.md") if path.name != "ARCHITECTURE.md")
BLOCK = re.compile(r"^```(bash|python)\n(.*?)^```$", re.DOTALL | re.MULTILINE)


def runnable_blocks(guide: Path) -> list[tuple[str, str]]:
    return BLOCK.findall(guide.read_text(encoding="utf-8"))


def test_every_guide_has_blocks_to_run_and_no_unrun_language():
    assert GUIDES, "no user guides in docs/"
    for guide in GUIDES:
        text = guide.read_text(encoding="utf-8")
        fences = re.findall(r"^```(\w*)$", text, re.MULTILINE)
        assert set(fences[::2]) <= {"bash", "python", "text"}, f"{guide.name}: a block no test runs: {set(fences[::2])}"
        assert runnable_blocks(guide), f"{guide.name} has no block to run"


@pytest.mark.slow
@pytest.mark.parametrize("guide", GUIDES, ids=lambda path: path.name)
def test_guide_blocks_run_in_order(guide, tmp_path):
    environment = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(REPO)}
    for number, (language, code) in enumerate(runnable_blocks(guide), start=1):
        command = ["bash", "-euo", "pipefail", "-c", code] if language == "bash" else [sys.executable, "-c", code]
        finished = subprocess.run(command, cwd=tmp_path, env=environment, capture_output=True, text=True, timeout=900)
        assert finished.returncode == 0, (f"{guide.name}, block {number} ({language}) failed:\n{code}\n"
                                          f"stdout:\n{finished.stdout[-3000:]}\nstderr:\n{finished.stderr[-3000:]}")
