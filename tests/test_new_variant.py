"""A new variant is one module and one registry line: a toy one (softmax over halved scores, `exportable = False`)
written into a copy of the package, with no other file touched, gets its cases in both families (the Transformer at
every site, the LSTM's source attention) in every invariant test that reads the registry (cache = no cache, padded =
alone, beam search reordering the state, fast path = generate, no host synchronisation, save -> fresh-process load
identical, the export refused), and its saved folder carries the imports Transformers < 5.10 needs to load it from a
local folder (loaded so on 4.57).

Slow: the invariants run in a pytest of their own over the copy (about a minute).
"""

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from transformers.dynamic_module_utils import get_relative_import_files, get_relative_imports

from hf_headattn.runtime.attention_registry import ATTENTION_VARIANTS

from helpers import WITHOUT_PACKAGE
from transformers_envs import transformers_env


pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent
TOY_MODULE = '''"""Softmax over halved scores: the toy variant of tests/test_new_variant.py."""

import torch

from .attention_sparse import NormalizedAttention


class HalvedAttention(NormalizedAttention):
    name = "halved"
    description = "softmax over halved scores (a test's toy)"
    exportable = False
    no_attention_function = "it is a test's toy"

    def normalize(self, scores, allowed):
        scores = (scores.float() if scores.dtype in (torch.float16, torch.bfloat16) else scores) / 2
        if allowed is not None:
            scores = scores.masked_fill(~allowed, torch.finfo(scores.dtype).min)
        return torch.softmax(scores, dim=-1)
'''
# the invariant tests that take their cases from the registry
INVARIANT_TESTS = ["tests/test_generation_invariants.py", "tests/test_decoding.py", "tests/test_host_sync.py",
                   "tests/test_remote_code.py", "tests/test_deploy.py"]


def add_toy_variant(root: Path) -> None:
    """Write the toy module and its registry line (an import and an entry) into the package copy at `root`."""
    runtime = root / "hf_headattn" / "runtime"
    (runtime / "attention_halved.py").write_text(TOY_MODULE)
    registry = runtime / "attention_registry.py"
    text = registry.read_text()
    text = text.replace("\n\nATTENTION_VARIANTS",
                        "\nfrom .attention_halved import HalvedAttention\n\n\nATTENTION_VARIANTS", 1)
    text = text.replace("\n}\n", "\n    HalvedAttention.name: HalvedAttention,\n}\n", 1)
    registry.write_text(text)


@pytest.fixture(scope="module")
def package_copy(tmp_path_factory):
    root = tmp_path_factory.mktemp("package-copy")
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for name in ("hf_headattn", "tests"):
        shutil.copytree(ROOT / name, root / name, ignore=ignore)
    shutil.copy(ROOT / "pyproject.toml", root)
    add_toy_variant(root)
    return root


def test_the_toy_is_registered_in_the_copy_only(package_copy):
    done = subprocess.run([sys.executable, "-c", "from hf_headattn.runtime.attention_registry import "
                           "ATTENTION_VARIANTS; print(sorted(ATTENTION_VARIANTS))"],
                          cwd=package_copy, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "'halved'" in done.stdout and "halved" not in ATTENTION_VARIANTS


def test_every_registry_invariant_covers_the_toy_variant(package_copy):
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-k", "halved", *INVARIANT_TESTS],
        cwd=package_copy, capture_output=True, text=True, timeout=1800,
    )
    summary = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else ""
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-3000:]
    passed = int(re.search(r"(\d+) passed", summary).group(1))
    # per file, at least: 5 invariants x 2 searches; the fast path's ~10 searches; host sync; the fresh-process load;
    # the export refused at each of the 3 sites
    assert passed >= 30, summary
    collected = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "--collect-only", "-p", "no:cacheprovider", "-k", "halved",
         *INVARIANT_TESTS], cwd=package_copy, capture_output=True, text=True, timeout=600).stdout
    for test_file in ("test_generation_invariants", "test_decoding", "test_host_sync", "test_remote_code",
                      "test_deploy"):
        assert f"tests/{test_file}.py::" in collected, f"{test_file} has no case of the new variant"


# In the copy: a model with the toy at every site, saved, and its logits on a fixed batch
SAVE_SCRIPT = """
import sys, torch
from hf_headattn import HeadAttnConfig, HeadAttnForConditionalGeneration
torch.manual_seed(0)
config = HeadAttnConfig(vocab_size=50, d_model=16, encoder_layers=1, decoder_layers=1, encoder_attention_heads=2,
                        decoder_attention_heads=2, encoder_ffn_dim=32, decoder_ffn_dim=32, pad_token_id=0,
                        eos_token_id=1, decoder_start_token_id=0, encoder_self_attention="halved",
                        decoder_self_attention="halved", cross_attention="halved")
model = HeadAttnForConditionalGeneration(config).eval()
model.save_pretrained(sys.argv[1])
ids = torch.arange(2, 14).view(2, 6)
print("LOGITS", model(input_ids=ids, decoder_input_ids=ids[:, :3]).logits.sum().item())
"""
# Where hf_headattn is not installed: the saved folder through its own code
LOAD_SCRIPT = WITHOUT_PACKAGE + """
import torch
from transformers import AutoModelForSeq2SeqLM
model = AutoModelForSeq2SeqLM.from_pretrained(sys.argv[1], trust_remote_code=True).eval()
ids = torch.arange(2, 14).view(2, 6)
with torch.no_grad():
    print("LOGITS", model(input_ids=ids, decoder_input_ids=ids[:, :3]).logits.sum().item())
"""


def _logits(command, cwd, env=None) -> float:
    done = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return float(next(line for line in done.stdout.splitlines() if line.startswith("LOGITS")).split()[1])


@pytest.fixture(scope="module")
def saved_toy(package_copy, tmp_path_factory):
    folder = tmp_path_factory.mktemp("toy-model")
    return folder, _logits([sys.executable, "-c", SAVE_SCRIPT, str(folder)], package_copy)


def test_the_toy_models_saved_entries_import_its_module_directly(saved_toy):
    folder, _ = saved_toy
    for entry in ("configuration_headattn", "modeling_headattn", "attention_functions"):
        module_file = folder / f"{entry}.py"
        direct = set(get_relative_imports(module_file))
        assert "attention_halved" in direct, entry
        assert {Path(path).stem for path in get_relative_import_files(module_file)} <= direct, entry


def test_the_toy_model_loads_through_its_own_code_on_transformers_4_57(saved_toy, tmp_path):
    """4.57 copies a local folder's entry and only its direct relative imports into its modules cache."""
    folder, expected = saved_toy
    env = {"HF_HUB_OFFLINE": "1", "HF_MODULES_CACHE": str(tmp_path / "modules"), "PATH": "/usr/bin:/bin",
           "OMP_NUM_THREADS": "1"}
    logits = _logits([str(transformers_env("4.57.6")), "-c", LOAD_SCRIPT, str(folder)], tmp_path, env)
    assert logits == pytest.approx(expected, abs=1e-4)
