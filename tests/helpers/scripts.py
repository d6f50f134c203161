"""Paths of the checkout and running its scripts: the repository, the real data beside it, fresh interpreters
without the package, and examples/ or benchmarks/ scripts loaded as modules."""

import importlib.util
from pathlib import Path


# Prepended to scripts run in a fresh interpreter: makes hf_headattn unimportable there, so that a saved folder
# must load through its own copied code (trust_remote_code), as for a user who never installed the package.
WITHOUT_PACKAGE = """import importlib.abc, json, sys

class BlockPackage(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "hf_headattn" or name.startswith("hf_headattn."):
            raise ImportError("hf_headattn is deliberately not importable in this process")

sys.meta_path.insert(0, BlockPackage())
"""

REPO = Path(__file__).resolve().parents[2]
MULTI30K = REPO.parent / "shared" / "data" / "multi30k"  # real data beside the checkout, as on CI


def load_script(path: Path):
    """A script of the repository (examples/, benchmarks/: not packages) as a module, to call its functions."""
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def load_example(name: str):
    """The script examples/<name>.py as a module."""
    return load_script(REPO / "examples" / f"{name}.py")
