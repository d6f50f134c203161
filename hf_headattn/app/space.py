"""The Gradio Space that ``hf-headattn-hub space`` writes: the web page (:mod:`hf_headattn.app`) on model folders
(copied in, their :func:`~hf_headattn.publish.files_to_upload`) or Hub ids, with the page's modules copied into the
Space, so that it runs with torch, Transformers and gradio alone; :func:`check_space_folder` and :func:`push_space`
check and upload it as a Space (``repo_type="space"``, gradio SDK).

Tooling, not model runtime: never copied into a checkpoint.
"""

from __future__ import annotations

import json
import re
import shutil
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from huggingface_hub.utils import validate_repo_id

from ..cli import model_path_problem
from ..publish.cards import load_config, markdown_table_cell
from ..publish.upload import (
    TOKENIZER_VOCAB_FILES,
    WEIGHT_FILES,
    files_to_upload,
    missing_code_files,
    upload_checked_files,
)
from ..output_files import check_output_folder, new_folder

__all__ = ["SPACE_PACKAGE", "check_space_folder", "push_space", "space_code_files", "write_space"]

# A Space holds the web page (hf_headattn.app) with the modules it runs, copied unchanged into a package of the
# Space laid out as hf_headattn is, so that it runs with torch, Transformers and gradio alone; its models load
# through their own code.
SPACE_COMMAND = "hf-headattn-hub space"
SPACE_PACKAGE = "headattn_app"
PACKAGE_ROOT = Path(__file__).resolve().parent.parent  # hf_headattn/
# The page's package; the Space holds it and every module it imports (space_code_files), as paths from the root.
SPACE_ENTRY = "app/__init__.py"
# The commands' model loading, imported only by the commands' main functions: a Space loads its models through their
# own code (panels.load_through_own_code), and loading.py would reach into the package's runtime.
SPACE_LEFT_OUT = ("loading.py",)
# What a Space never holds: its models bring their own runtime code.
SPACE_REFUSED_PACKAGES = ("runtime",)
SPACE_MODELS = "models"
SPACE_FILES = ("app.py", "requirements.txt", "README.md")
SPACE_REQUIREMENTS = ("torch", "transformers")  # with this package's own version ranges (its metadata)

SPACE_APP = '''"""A Gradio Space written by `hf-headattn-hub space`: translate with {names} and compare where the models'
attention goes (heat maps per layer and head, word alignments, weights over heads, fertility bounds).

It runs with torch, Transformers and gradio alone: each model loads through the code saved with it
(trust_remote_code=True), and {package}/ holds the page's code, copied from hf_headattn {version}.
Locally: pip install -r requirements.txt "gradio=={gradio_version}" && python app.py
"""

import os
import sys
from pathlib import Path

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))  # {package}/ beside this file, wherever it is started from

from {package}.app import build_demo, launch, load_models  # noqa: E402  (after the two settings above)

# (label in the page, where it loads from: a folder of this Space or a Hub model id, whether it is a folder here)
MODELS = {models}
# what a visitor may ask for (see {package}/app/page.py)
SETTINGS = {settings}

models = load_models([str(HERE / source) if bundled else source for _, source, bundled in MODELS],
                     labels=[label for label, _, _ in MODELS])
demo = build_demo(models, **SETTINGS)

if __name__ == "__main__":
    launch(demo)  # GRADIO_SERVER_NAME / GRADIO_SERVER_PORT (a Space sets them), else 127.0.0.1:7860
'''



def _code_closure(root: Path, entry: str) -> tuple[list[str], list[str]]:
    """(the modules under `root` that `entry` needs, those missing), as paths relative to `root`: `entry`, the
    ``__init__.py`` of every subpackage a needed module sits in (Python runs it first), and every module they import
    relatively, directly or through others, at module or function level, but :data:`SPACE_LEFT_OUT`. The root's own
    ``__init__.py`` is not among them: a Space writes its own.

    Raises:
        ValueError: a module that imports hf_headattn by name, the runtime (:data:`SPACE_REFUSED_PACKAGES`) or
            beyond the root, which a Space does not have.
    """
    import ast

    needed, missing, to_visit = [], [], [entry]
    while to_visit:
        name = to_visit.pop()
        if name in needed or name in missing or name in SPACE_LEFT_OUT:
            continue
        if not (root / name).is_file():
            missing.append(name)
            continue
        needed.append(name)
        package = PurePosixPath(name).parent.parts  # the subpackage the module is in; () at the root
        if package:
            to_visit.append("/".join([*package, "__init__.py"]))
        for node in ast.walk(ast.parse((root / name).read_text(encoding="utf-8"))):
            absolute = ([alias.name for alias in node.names] if isinstance(node, ast.Import) else
                        [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else [])
            if any(module.split(".")[0] == "hf_headattn" for module in absolute):
                raise ValueError(f"{name} imports hf_headattn by name, which a Space does not have")
            if not isinstance(node, ast.ImportFrom) or not node.level:
                continue
            imported = f"{'.' * node.level}{node.module or ''}"
            if node.level - 1 > len(package):
                raise ValueError(f"{name} imports from beyond the package ({imported})")
            anchor = list(package[:len(package) - (node.level - 1)])
            if node.module:
                targets = [[*anchor, *node.module.split(".")]]
            else:  # `from . import x`: x is a module, or a name of the package's __init__ (visited already)
                targets = [[*anchor, alias.name] for alias in node.names
                           if _module_path(root, [*anchor, alias.name]) is not None or not anchor]
            for parts in targets:
                if parts[0] in SPACE_REFUSED_PACKAGES:
                    raise ValueError(f"{name} imports the {parts[0]} ({imported}), which a Space does not have: its "
                                     "models load through their own code")
                to_visit.append(_module_path(root, parts) or "/".join(parts) + ".py")
    return sorted(needed), sorted(missing)


def _module_path(root: Path, parts: Sequence[str]) -> str | None:
    """The file of the module `parts` (a module's .py, or a subpackage's __init__.py) under `root`, if it exists."""
    for path in ("/".join(parts) + ".py", "/".join([*parts, "__init__.py"])):
        if (root / path).is_file():
            return path
    return None


def space_code_files() -> list[str]:
    """The package's modules a Space runs (paths from the package's root, copied unchanged into its
    ``headattn_app/``): the web page (:mod:`hf_headattn.app`) and every module it imports, transitively, but
    :data:`SPACE_LEFT_OUT`; never this module, which the page does not import."""
    needed, missing = _code_closure(PACKAGE_ROOT, SPACE_ENTRY)
    if missing:
        raise ValueError(f"The web page imports modules the package lacks: {', '.join(missing)}")
    return needed


def _space_model_problems(model_dir: Path) -> list[str]:
    """What a model folder lacks to run in a Space without this package: config with an ``auto_map`` entry for
    AutoModelForSeq2SeqLM and the code it needs, safetensors weights, a tokenizer (a card is optional: its
    examples become the page's)."""
    files = set(files_to_upload(model_dir))
    problems = []
    if "config.json" not in files:
        problems.append("config.json")
    else:
        config = json.loads((model_dir / "config.json").read_text(encoding="utf-8"))
        if "AutoModelForSeq2SeqLM" not in (config.get("auto_map") or {}):
            problems.append("config.json auto_map entry AutoModelForSeq2SeqLM (re-save the model with save_pretrained)")
        missing = missing_code_files(model_dir, config)
        if missing:
            problems.append(f"runtime code file(s) {', '.join(missing)} (re-save the model with save_pretrained)")
    if not any(name in files for name in WEIGHT_FILES):
        problems.append("weights as model.safetensors")
    if "tokenizer_config.json" not in files or not any(name in files for name in TOKENIZER_VOCAB_FILES):
        problems.append("a tokenizer (tokenizer_config.json and its vocabulary; save the tokenizer into the folder)")
    return problems


def _space_model_name(model_dir: Path, taken: set[str]) -> str:
    """A folder name for a bundled model: the folder's name, with its parent's before it when that name says
    nothing (``runs/demo-csparsemax/model`` -> ``demo-csparsemax-model``), unique among `taken`."""
    parts = model_dir.resolve().parts
    name = "-".join(parts[-2:]) if parts[-1] in ("model", "final", "output") and len(parts) > 1 else parts[-1]
    name = re.sub(r"[^A-Za-z0-9._-]+", "-", name).strip("-.") or "model"
    unique, suffix = name, 2
    while unique in taken:
        unique, suffix = f"{name}-{suffix}", suffix + 1
    return unique


def _space_requirements() -> str:
    """requirements.txt: torch and Transformers with this package's own version ranges (gradio comes from the
    README's sdk_version, as Spaces install it)."""
    from importlib.metadata import requires

    wanted = []
    for requirement in requires("hf_headattn") or []:
        name = re.split(r"[<>=!~;\[ ]", requirement, maxsplit=1)[0].lower()
        if name in SPACE_REQUIREMENTS and "extra ==" not in requirement:
            wanted.append(requirement.replace(" ", ""))
    return "\n".join(sorted(wanted)) + "\n"


@dataclass(frozen=True)
class _SpaceModel:
    """One model of a Space: its label in the page, where the Space loads it from (its folder in the Space, or
    its Hub id), and the local folder it is copied from (None for a Hub id)."""

    label: str
    source: str
    folder: Path | None

    @property
    def bundled(self) -> bool:
        return self.folder is not None


def write_space(
    models: Sequence[str | Path],
    output_dir: str | Path,
    *,
    title: str | None = None,
    overwrite: bool = False,
    settings: Mapping | None = None,
) -> Path:
    """Write a Gradio Space folder that runs the web demo (:mod:`hf_headattn.app`) on `models`, and return it.

    The folder holds ``app.py`` (the Space's entry), ``headattn_app/`` (the demo's modules, copied unchanged),
    ``requirements.txt`` (torch, Transformers), ``README.md`` (the Space's front matter: gradio SDK at the installed
    gradio's version, ``app_file``, the Hub models it uses) and ``models/``: each local model folder's files that
    :func:`files_to_upload` names (config, weights, code, tokenizer, card). A Hub model id is loaded from the Hub
    instead. It runs with torch, Transformers and gradio alone (``python app.py``); :func:`push_space` uploads it.

    Args:
        models: Saved model folders, or Hub model ids; one panel each, the first two side by side.
        output_dir: The Space folder to write (written to a temporary folder first and renamed into place).
        title: The Space's title (default: from the models' names).
        overwrite: Replace an existing `output_dir`.
        settings: The page's limits and starting values, passed to :func:`hf_headattn.app.build_demo`
            (``max_lines``, ``time_limit``, ``concurrency_limit``, ``queue_size``, ``num_beams``,
            ``max_new_tokens``); default: the app's defaults.

    Raises:
        ValueError: no model, a folder missing what a Space needs (all problems named), a name that is neither a
            folder nor a Hub id, an `output_dir` that exists (without `overwrite`) or is inside a model folder, or
            gradio not installed (the Space pins its version).
    """
    from importlib.metadata import version

    if not models:
        raise ValueError("Name at least one model for the Space")
    gradio_version = _installed_gradio_version()
    output_dir = Path(output_dir)
    space_models = _resolve_space_models(models)
    local_models = [model.folder for model in space_models if model.bundled]
    check_output_folder(output_dir, command=SPACE_COMMAND, overwrite=overwrite, inputs=local_models)
    if not output_dir.parent.is_dir():
        raise ValueError(f"Cannot write {output_dir}: its folder {output_dir.parent} does not exist")
    page_settings = _page_settings(settings)
    names = [model.label for model in space_models]
    title = title or ("hf_headattn: " + " vs ".join(names[:2]) + (" and more" if len(names) > 2 else ""))
    package_version = version("hf_headattn")

    with new_folder(output_dir, command=SPACE_COMMAND, overwrite=overwrite, inputs=local_models) as staging:
        _copy_page_code(staging / SPACE_PACKAGE, package_version)
        rows = _bundle_models(staging, space_models)
        listing = ",\n    ".join(repr((model.label, model.source, model.bundled)) for model in space_models)
        (staging / "app.py").write_text(SPACE_APP.format(
            names=", ".join(names), package=SPACE_PACKAGE, version=package_version, gradio_version=gradio_version,
            models=f"[\n    {listing},\n]", settings=repr(page_settings)), encoding="utf-8")
        (staging / "requirements.txt").write_text(_space_requirements(), encoding="utf-8")
        (staging / "README.md").write_text(_space_readme(title, space_models, rows, gradio_version=gradio_version,
                                                         package_version=package_version), encoding="utf-8")
    return output_dir


def _installed_gradio_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("gradio")
    except PackageNotFoundError:
        raise ValueError('Writing a Space needs gradio installed (the app extra: pip install "gradio>=6,<7"): the Space pins the '
                         "gradio version its page was made with") from None


def _resolve_space_models(models: Sequence[str | Path]) -> list[_SpaceModel]:
    """Each of `models` as a folder to bundle (under a unique name) or a Hub id; refused (ValueError) at the first
    name that is neither, or naming every folder that lacks what a Space needs, all at once."""
    space_models, problems, taken = [], [], set()
    for model in models:
        path = Path(model)
        if path.is_dir():
            missing = _space_model_problems(path)
            if missing:
                problems.append(f"{path}: " + "; ".join(missing))
            name = _space_model_name(path, taken)
            taken.add(name)
            space_models.append(_SpaceModel(name, f"{SPACE_MODELS}/{name}", path))
        else:
            try:
                validate_repo_id(str(model))
            except ValueError:
                raise ValueError(f"{model} is neither a model folder nor a Hub model id") from None
            problem = model_path_problem(model, flag="model")  # a mistyped folder is never written in as a Hub id
            if problem:
                raise ValueError(problem)
            space_models.append(_SpaceModel(str(model), str(model), None))
    if problems:
        raise ValueError("Cannot write the Space; missing: " + " | ".join(problems))
    return space_models


def _page_settings(settings: Mapping | None) -> dict:
    """The page's settings: the app's defaults, overridden by `settings` (an unknown name refused)."""
    from .page import DEFAULT_CONCURRENCY, DEFAULT_QUEUE_SIZE
    from .panels import DEFAULT_MAX_LINES, DEFAULT_MAX_NEW_TOKENS, DEFAULT_NUM_BEAMS, DEFAULT_TIME_LIMIT

    page_settings = dict(max_lines=DEFAULT_MAX_LINES, time_limit=DEFAULT_TIME_LIMIT,
                         concurrency_limit=DEFAULT_CONCURRENCY, queue_size=DEFAULT_QUEUE_SIZE,
                         num_beams=DEFAULT_NUM_BEAMS, max_new_tokens=DEFAULT_MAX_NEW_TOKENS)
    unknown = set(settings or {}) - set(page_settings)
    if unknown:
        raise ValueError(f"Unknown page setting(s) {', '.join(sorted(unknown))}; known: {', '.join(page_settings)}")
    page_settings.update(settings or {})
    return page_settings


def _copy_page_code(code_dir: Path, package_version: str) -> None:
    """The page's modules (:func:`space_code_files`), copied unchanged into the Space's package `code_dir`."""
    code_dir.mkdir()
    (code_dir / "__init__.py").write_text(f'"""The web demo of hf_headattn {package_version}, copied unchanged by '
                                          '`hf-headattn-hub space`."""\n', encoding="utf-8")
    for module in space_code_files():
        (code_dir / module).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(PACKAGE_ROOT / module, code_dir / module)


def _bundle_models(staging: Path, space_models: list[_SpaceModel]) -> list[str]:
    """Copy each local model's files (:func:`files_to_upload`) into the Space; the README's table row of every
    model."""
    from .panels import describe_model

    rows = []
    for model in space_models:
        if model.bundled:
            for name in files_to_upload(model.folder):
                (staging / model.source / name).parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(model.folder / name, staging / model.source / name)
            description = describe_model(load_config(model.folder))
        else:
            description = "loaded from the Hub"
        rows.append(f"| {markdown_table_cell(model.label)} | {markdown_table_cell(description)} | `{model.source}` |")
    return rows


def _space_readme(title: str, space_models: list[_SpaceModel], rows: list[str], *, gradio_version: str,
                  package_version: str) -> str:
    """README.md: the Space's front matter (its card: SDK, entry, the Hub models it uses), then what it shows, its
    models' table (`rows`) and how to run it elsewhere."""
    from huggingface_hub import SpaceCardData

    card = SpaceCardData(title=title, sdk="gradio", sdk_version=gradio_version, app_file="app.py",
                         models=[model.source for model in space_models if not model.bundled] or None,
                         tags=["translation", "hf_headattn", "attention-visualization"], emoji="🔎",
                         colorFrom="blue", colorTo="indigo", pinned=False,
                         short_description="Translate and compare where attention variants look")
    return (
        f"---\n{card.to_yaml()}\n---\n\n# {title}\n\nTranslate with {len(space_models)} hf_headattn model(s) and "
        "compare, two side by side, where their attention goes: the cross-attention as heat maps of source "
        "words x target words per layer and head, the word alignment as links, DHICM and multi-hop weights "
        "over heads, and csoftmax / csparsemax cumulative attention against the fertility bounds.\n\n"
        "| model | attention | loads from |\n|---|---|---|\n" + "\n".join(rows) + "\n\n"
        "The Space runs with torch, Transformers and gradio alone: each model loads through the code saved "
        f"with it (`trust_remote_code=True`), and `{SPACE_PACKAGE}/` holds the page's code, copied from "
        f"hf_headattn {package_version}. To run it elsewhere:\n\n"
        f"```bash\npip install -r requirements.txt \"gradio=={gradio_version}\"\npython app.py   # then open "
        "http://127.0.0.1:7860\n```\n")


def check_space_folder(space_dir: str | Path) -> list[str]:
    """Check that `space_dir` is a Space :func:`write_space` wrote, complete, and return the files that
    :func:`push_space` uploads (sorted): its entry, requirements, card, the page's code and each bundled model's
    files (:func:`files_to_upload`); caches a local run leaves (``__pycache__``, ``.gradio``) stay home.

    Raises:
        FileNotFoundError: a missing folder.
        ValueError: naming everything missing, all at once.
    """
    from huggingface_hub import SpaceCard

    space_dir = Path(space_dir)
    if not space_dir.is_dir():
        raise FileNotFoundError(f"Space folder not found: {space_dir}")
    problems = [name for name in SPACE_FILES if not (space_dir / name).is_file()]
    code_dir = space_dir / SPACE_PACKAGE
    present, absent = _code_closure(code_dir, SPACE_ENTRY) if code_dir.is_dir() else ([], [SPACE_ENTRY])
    code = [f"{SPACE_PACKAGE}/{name}" for name in ("__init__.py", *present)]
    problems += [f"{SPACE_PACKAGE}/{name}" for name in ("__init__.py", *absent) if not (code_dir / name).is_file()]
    if (space_dir / "README.md").is_file():
        metadata = SpaceCard.load(space_dir / "README.md").data.to_dict()
        if metadata.get("sdk") != "gradio" or metadata.get("app_file") != "app.py":
            problems.append("README.md front matter with sdk: gradio and app_file: app.py (write the folder with "
                            "hf-headattn-hub space)")
    files = [name for name in SPACE_FILES if (space_dir / name).is_file()] + [name for name in code
                                                                               if (space_dir / name).is_file()]
    models_dir = space_dir / SPACE_MODELS
    for model_dir in sorted(models_dir.iterdir()) if models_dir.is_dir() else []:
        if model_dir.is_dir():
            missing = _space_model_problems(model_dir)
            problems += [f"{SPACE_MODELS}/{model_dir.name}: {'; '.join(missing)}"] if missing else []
            files += [f"{SPACE_MODELS}/{model_dir.name}/{name}" for name in files_to_upload(model_dir)]
    if problems:
        raise ValueError(f"{space_dir} is not a complete Space; missing: " + "; ".join(problems))
    return sorted(files)


def push_space(space_dir: str | Path, repo_id: str, *, token: str | None = None, private: bool = False,
               commit_message: str = "Upload the hf_headattn web demo"):
    """Upload a Space folder written by :func:`write_space` to the Hub as a Gradio Space, in one commit: runs
    :func:`check_space_folder` first (nothing is created for an incomplete folder), then
    ``HfApi.create_repo(repo_type="space", space_sdk="gradio", exist_ok=True)`` and ``upload_folder`` of the checked
    files alone.

    Returns:
        What ``upload_folder`` returns (a ``CommitInfo``).
    """
    validate_repo_id(repo_id)
    space_dir = Path(space_dir)
    uploaded = check_space_folder(space_dir)
    return upload_checked_files(space_dir, repo_id, uploaded, token=token, private=private,
                                commit_message=commit_message, repo_type="space", space_sdk="gradio")
