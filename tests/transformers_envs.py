"""Clean virtual environments with torch and one Transformers release and without hf_headattn, in which the
version-matrix tests load saved models through their own code, as a Hub user on that release would.

The environments are built once and reused (under $HF_HEADATTN_TEST_ENVS, default ~/.cache/hf_headattn/test-envs):
one with torch alone, and one per Transformers release that sees that torch through a .pth file, so torch is
installed once. pip's own cache keeps the downloaded wheels between builds.
"""

import os
import subprocess
import sys
from pathlib import Path


ENV_ROOT = Path(os.environ.get("HF_HEADATTN_TEST_ENVS", Path.home() / ".cache" / "hf_headattn" / "test-envs"))
TORCH_VERSION = "2.13.0"  # the CPU wheel this project's machines install; a bare `torch` would pull a CUDA build
READY = ".ready"  # written last, so an interrupted build is redone


def _python(env: Path) -> Path:
    return env / "bin" / "python"


def _site_packages(env: Path) -> Path:
    return next((env / "lib").glob("python3*/site-packages"))


def _pip_install(env: Path, *requirements: str) -> None:
    subprocess.run([_python(env), "-m", "pip", "install", "--quiet", "--disable-pip-version-check", *requirements],
                   check=True, timeout=1200)


def _build(env: Path, populate) -> Path:
    if not (env / READY).exists():
        subprocess.run([sys.executable, "-m", "venv", "--clear", env], check=True, timeout=300)
        populate(env)
        (env / READY).write_text("")
    return env


def torch_env() -> Path:
    """A virtual environment with torch alone."""
    return _build(ENV_ROOT / f"torch-{TORCH_VERSION}", lambda env: _pip_install(env, f"torch=={TORCH_VERSION}"))


def transformers_env(version: str) -> Path:
    """The python of a clean environment with torch, `transformers==version` and what Trainer needs."""
    torch_site = _site_packages(torch_env())

    def populate(env: Path) -> None:
        (_site_packages(env) / "torch_env.pth").write_text(f"{torch_site}\n")
        _pip_install(env, f"transformers=={version}", "accelerate>=1.0")

    return _python(_build(ENV_ROOT / f"transformers-{version}-torch-{TORCH_VERSION}", populate))
