"""The wheel is a first-class install: it holds every file of the package (the model card templates included), and
installed into a fresh virtual environment, away from the source tree, every command answers --help and a tiny
corpus goes through train -> evaluate -> hub card -> translate (slow: the environment takes minutes to fill)."""

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from helpers import COMMANDS, REPO


def package_files() -> list[str]:
    """The files of the package as a clone has them (tracked, or new and not ignored: no build outputs)."""
    listed = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard", "hf_headattn"],
                            cwd=REPO, capture_output=True, text=True, check=True).stdout.splitlines()
    return [name for name in listed if (REPO / name).is_file()]


def build_wheel(folder: Path, *options: str) -> Path:
    """The wheel of a clean copy of the package's sources (a checkout's build/ and *.egg-info/ would leak into it)."""
    source = folder / "source"
    for name in ["pyproject.toml", "README.md", *package_files()]:
        (source / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / name, source / name)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", *options, "--wheel-dir", str(folder),
                    str(source)], check=True, cwd=folder)
    wheels = list(folder.glob("hf_headattn-*.whl"))
    assert len(wheels) == 1, wheels
    return wheels[0]


def test_the_wheel_holds_every_file_of_the_package(tmp_path):
    """Whatever lives in hf_headattn/ (modules, the card templates, the evaluate modules) ships in the wheel: a file
    added there that pyproject.toml's package data leaves out fails here, not in a user's installation."""
    files = set(package_files())
    assert "hf_headattn/model_cards/transformer.md" in files
    with zipfile.ZipFile(build_wheel(tmp_path, "--no-build-isolation")) as wheel:
        shipped = set(wheel.namelist())
    assert not files - shipped, f"not in the wheel: {sorted(files - shipped)}"
    assert not any(name.startswith(("tests/", "examples/", "benchmarks/")) for name in shipped)


def run(command: str, environment: dict, cwd: Path) -> str:
    """One shell line in the fresh environment; its output (stdout and stderr) is returned, and shown on failure."""
    finished = subprocess.run(["bash", "-euo", "pipefail", "-c", command], cwd=cwd, env=environment,
                              capture_output=True, text=True, timeout=1500)
    assert finished.returncode == 0, f"{command}\nstdout:\n{finished.stdout[-4000:]}\nstderr:\n{finished.stderr[-4000:]}"
    return finished.stdout + finished.stderr


@pytest.mark.slow
@pytest.mark.wheel
def test_the_wheel_installs_into_a_fresh_environment_and_runs_train_evaluate_card_translate(tmp_path):
    wheel = build_wheel(tmp_path)  # as a user builds it: setuptools in pip's isolated build environment
    elsewhere = tmp_path / "elsewhere"  # not the checkout: nothing of the source tree is importable from here
    elsewhere.mkdir()
    venv = tmp_path / "venv"
    environment = {key: value for key, value in os.environ.items()
                   if key not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    environment.update(PATH=f"{venv / 'bin'}{os.pathsep}{os.environ['PATH']}", HF_HUB_OFFLINE="1",
                       HF_HEADATTN_CACHE=str(tmp_path / "cache"), PIP_QUIET="1")
    # README's order: torch first (pip would otherwise pull the CUDA build), then the wheel and its dependencies
    run(f"{sys.executable} -m venv {venv}", environment, elsewhere)
    run("python -m pip install torch==2.13.0", environment, elsewhere)
    run(f"python -m pip install {wheel}", environment, elsewhere)

    where = run("python -c 'import hf_headattn, transformers; print(hf_headattn.__file__)'", environment, elsewhere)
    assert where.strip().startswith(str(venv)), where
    for command in COMMANDS:
        assert "(default:" in run(f"{command} --help", environment, elsewhere), command
    for module in ("hf_headattn", "hf_headattn.commands.train"):  # the python -m forms
        run(f"python -m {module} --help", environment, elsewhere)

    run("python -c 'from hf_headattn.toy_corpus import write_toy_corpus; "
        "write_toy_corpus(\"data\", n_train=300, n_valid=20, n_test=12)'", environment, elsewhere)
    data = "--train_source data/train.src --train_target data/train.tgt"
    trained = run(f"hf-headattn-train {data} --valid_source data/valid.src --valid_target data/valid.tgt "
                  "--vocab_size 200 --d_model 32 --layers 1 --heads 2 --ffn_dim 64 --max_steps 20 --logging_steps 10 "
                  "--max_length 24 --output_dir model", environment, elsewhere)
    assert "trained 20 steps" in trained
    evaluated = run(f"hf-headattn-evaluate --model model --source data/test.src --reference data/test.tgt "
                    f"{data} --drop_runs 1 --num_beams 2 --output_dir model/eval", environment, elsewhere)
    assert "| DROP " in evaluated and "12 sentences | written: " in evaluated
    run("hf-headattn-hub card --model model --evaluation model/eval/test.beam2.metrics.json "
        "--dataset_name 'Toy German-English' --repo_id someone/toy-de-en", environment, elsewhere)
    card = (elsewhere / "model" / "README.md").read_text(encoding="utf-8")
    assert "someone/toy-de-en" in card and "model-index" in card
    run("hf-headattn-translate --model model --input data/test.src --output test.hyp --quiet", environment, elsewhere)
    assert len((elsewhere / "test.hyp").read_text(encoding="utf-8").splitlines()) == 12
