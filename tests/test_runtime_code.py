"""The runtime that travels with a checkpoint: hf_headattn/runtime/ is copied by Transformers' own mechanism
(`register_for_auto_class` -> `custom_object_save`), every saved entry module names what it needs directly (so
that Transformers < 5.10 copies it from a local folder: `remote_code.write_direct_imports`, at every save), and a
model loaded through remote code saves itself again with nothing missing, or refuses before writing anything."""

import ast
import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from transformers.dynamic_module_utils import get_relative_import_files, get_relative_imports

from hf_headattn import HeadAttnRNNConfig, HeadAttnRNNForConditionalGeneration
from hf_headattn.runtime import configuration_headattn, configuration_headattn_rnn
from hf_headattn.runtime.remote_code import IMPORTS_BEGIN, with_direct_imports, write_direct_imports

from helpers import WITHOUT_PACKAGE, random_model, tiny_config


RUNTIME = Path(configuration_headattn.__file__).parent
ENTRY_MODULES = sorted({
    reference.split(".")[0]
    for config_module in (configuration_headattn, configuration_headattn_rnn)
    for reference in [*config_module.AUTO_MAP.values(),
                      *(spec["impl"] for spec in config_module.CUSTOM_PIPELINES.values())]
})


# modules that Transformers loads by name from a saved folder: config.json's entries, and the attention functions
# (`get_class_from_dynamic_module("attention_functions.register_attention_functions", folder)`)
LOADED_BY_NAME = [*ENTRY_MODULES, "attention_functions"]


def _closure(module_file: Path) -> set[str]:
    return {Path(path).stem for path in get_relative_import_files(module_file)}


def test_committed_generated_imports_are_fresh():
    stale = [path.name for path in sorted(RUNTIME.glob("*.py"))
             if IMPORTS_BEGIN in path.read_text() and with_direct_imports(path) != path.read_text()]
    assert not stale, (f"the generated imports of {stale} are stale: run `python -m hf_headattn.runtime.remote_code` "
                       "and commit the result")


def test_saved_entries_import_every_module_they_need_directly(tmp_path):
    # Transformers < 5.10 copies from a local folder only the loaded module and its direct relative imports
    random_model(tiny_config()).save_pretrained(tmp_path / "transformer")
    HeadAttnRNNForConditionalGeneration(HeadAttnRNNConfig(vocab_size=50, embedding_size=8, hidden_size=16)
                                        ).save_pretrained(tmp_path / "rnn")
    for folder in (tmp_path / "transformer", tmp_path / "rnn"):
        for entry in LOADED_BY_NAME:
            module_file = folder / f"{entry}.py"
            if module_file.is_file():
                missing = sorted(_closure(module_file) - set(get_relative_imports(module_file)))
                assert not missing, f"{folder.name}/{entry}.py needs {missing} only through other modules"


def test_a_save_writes_the_imports_a_new_module_needs(tmp_path):
    # the committed block left stale on purpose: a module that only the registry imports
    runtime = tmp_path / "runtime"
    shutil.copytree(RUNTIME, runtime, ignore=shutil.ignore_patterns("__pycache__"))
    (runtime / "attention_new.py").write_text("NEW = 1\n")
    registry = runtime / "attention_registry.py"
    registry.write_text("from .attention_new import NEW  # noqa: F401\n" + registry.read_text())
    assert "attention_new" not in get_relative_imports(runtime / "modeling_headattn.py")

    changed = write_direct_imports(runtime)
    assert {f"{entry}.py" for entry in ENTRY_MODULES if entry.startswith(("configuration", "modeling"))} <= set(changed)
    for entry in LOADED_BY_NAME:
        assert _closure(runtime / f"{entry}.py") <= set(get_relative_imports(runtime / f"{entry}.py"))
    assert "from .attention_new import NEW  # noqa: F401" in (runtime / "modeling_headattn.py").read_text()
    assert write_direct_imports(runtime) == []  # written once, then fresh


def test_every_runtime_module_travels_and_imports_only_torch_transformers_and_the_standard_library():
    modules = {path.stem for path in RUNTIME.glob("*.py")} - {"__init__"}
    travelling = set().union(*(_closure(RUNTIME / f"{entry}.py") | {entry} for entry in ENTRY_MODULES))
    assert modules == travelling, f"not imported by any saved model: {sorted(modules - travelling)}"
    for module in sorted(modules):
        tree = ast.parse((RUNTIME / f"{module}.py").read_text())
        # triton only in the kernels' module and inside a try block, which Transformers' check of a remote-code
        # module's imports skips (a saved model loads without triton; `kernel_backend` imports the module when a
        # kernel runs)
        in_try = {id(child) for node in ast.walk(tree) if isinstance(node, ast.Try)
                  for body_node in node.body for child in ast.walk(body_node)}
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                names = [node.module]
            else:
                continue
            for name in names:
                top = name.split(".")[0]
                optional = top == "triton" and module == "triton_kernels" and id(node) in in_try
                assert top in ("torch", "transformers") or top in sys.stdlib_module_names or optional, \
                    f"{module}.py imports {name}"


def test_saved_folders_hold_the_code_their_models_import(tmp_path):
    transformer = random_model(tiny_config())
    transformer.save_pretrained(tmp_path / "transformer")
    rnn = HeadAttnRNNForConditionalGeneration(HeadAttnRNNConfig(vocab_size=50, embedding_size=8, hidden_size=16))
    rnn.save_pretrained(tmp_path / "rnn")

    for folder, family in ((tmp_path / "transformer", "headattn"), (tmp_path / "rnn", "headattn_rnn")):
        saved = {path.stem for path in folder.glob("*.py")}
        needed = _closure(RUNTIME / f"modeling_{family}.py") | {f"modeling_{family}", f"configuration_{family}"}
        assert saved == needed
        config = json.loads((folder / "config.json").read_text())
        assert config["auto_map"]["AutoModelForSeq2SeqLM"] == f"modeling_{family}.{type(transformer if family == 'headattn' else rnn).__name__}"
        assert "pipeline_headattn" in saved
    assert not any(name.startswith("modeling_headattn_rnn") for name in os.listdir(tmp_path / "transformer"))


# Loads a folder through its own code in a fresh interpreter without hf_headattn, optionally deletes one module from
# Transformers' modules cache (as an incomplete remote-code copy would be), and saves the model again.
RESAVE_SCRIPT = WITHOUT_PACKAGE + textwrap.dedent(
    """
    import os
    from pathlib import Path
    from transformers import AutoModelForSeq2SeqLM

    folder, target, delete = sys.argv[1], sys.argv[2], sys.argv[3]
    model = AutoModelForSeq2SeqLM.from_pretrained(folder, trust_remote_code=True)
    if delete:
        (Path(sys.modules[type(model).__module__].__file__).parent / delete).unlink()
    try:
        model.save_pretrained(target)
    except FileNotFoundError as error:
        print("ERROR " + str(error))
    print("FILES " + json.dumps(sorted(os.listdir(target)) if os.path.isdir(target) else []))
    """
)


def _resave(folder: Path, target: Path, delete: str, tmp_path: Path) -> tuple[str | None, list[str]]:
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    env.update(HF_HUB_OFFLINE="1", HF_MODULES_CACHE=str(tmp_path / f"modules-{target.name}"))
    done = subprocess.run([sys.executable, "-c", RESAVE_SCRIPT, str(folder), str(target), delete], cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    error = next((line[len("ERROR "):] for line in lines if line.startswith("ERROR ")), None)
    files = json.loads(next(line for line in lines if line.startswith("FILES "))[len("FILES "):])
    return error, files


def test_a_remote_code_model_saves_itself_again_complete_or_not_at_all(tmp_path):
    folder = tmp_path / "original"
    random_model(tiny_config(cross_attention="csparsemax")).save_pretrained(folder)
    original_files = sorted(os.listdir(folder))

    error, files = _resave(folder, tmp_path / "resaved", "", tmp_path)
    assert error is None and files == original_files
    error, files = _resave(tmp_path / "resaved", tmp_path / "resaved-again", "", tmp_path)
    assert error is None and files == original_files

    error, files = _resave(folder, tmp_path / "incomplete", "sparse_attention.py", tmp_path)
    assert error is not None and "sparse_attention.py" in error and "missing" in error
    assert files == []  # nothing written
