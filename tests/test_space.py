"""`hf-headattn-hub space` writes a Gradio Space folder that runs the web demo with torch, Transformers and gradio
alone (served here in a process where hf_headattn cannot be imported); `hub push --space` uploads it (the Hub is
mocked as in test_model_cards); incomplete input is refused before anything is written."""

import json
import os
import shutil
import subprocess
import sys
import textwrap
import time
import urllib.request
from pathlib import Path

import pytest
from huggingface_hub import SpaceCard

from hf_headattn.app.page import PAGE_OUTPUTS, PANEL_OUTPUTS
from hf_headattn.app.space import (SPACE_PACKAGE, _code_closure, check_space_folder, push_space, space_code_files,
                                   write_space)
from hf_headattn.commands import hub
from hf_headattn.publish import files_to_upload, upload
from hf_headattn.loading import load_model_and_tokenizer
from hf_headattn.translation import translate

from helpers import WITHOUT_PACKAGE, FakeHfApi, free_port, toy_data, train_tiny_model

gradio = pytest.importorskip("gradio", reason="writing and serving a Space needs gradio (pip install -e .[app])")

CARD = """---
language: [de, en]
---
# toy

The first test sentences:

| source | this model | reference |
|---|---|---|
| {first} | x | y |
| {second} | x | y |
"""


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return toy_data(tmp_path_factory.mktemp("data"))


@pytest.fixture(scope="module")
def folders(data, tmp_path_factory):
    """A softmax and a csparsemax Transformer, trained for 3 steps; the first with a card holding examples."""
    root = tmp_path_factory.mktemp("runs")
    softmax = train_tiny_model(data, root / "softmax" / "model", "transformer", max_length=48)
    csparsemax = train_tiny_model(data, root / "csparsemax", "transformer", "--cross_attention", "csparsemax",
                                  max_length=48)
    sources = data["test.src"].read_text(encoding="utf-8").splitlines()
    (softmax / "README.md").write_text(CARD.format(first=sources[0], second=sources[1]), encoding="utf-8")
    return softmax, csparsemax


@pytest.fixture(scope="module")
def space(folders, tmp_path_factory):
    return write_space(list(folders), tmp_path_factory.mktemp("out") / "space")


def test_the_folder_is_a_gradio_space_with_its_code_and_models(space, folders, data):
    softmax, csparsemax = folders
    card = SpaceCard.load(space / "README.md")
    assert (card.data.sdk, card.data.sdk_version, card.data.app_file) == ("gradio", gradio.__version__, "app.py")
    assert card.data.title == "hf_headattn: softmax-model vs csparsemax"
    assert "| csparsemax | Transformer, 2 decoder layers;" in card.text and "cross-attention: csparsemax" in card.text
    requirements = (space / "requirements.txt").read_text().split()
    assert sorted(name.split(">")[0].split("=")[0].split("<")[0] for name in requirements) == ["torch", "transformers"]
    package = Path(upload.__file__).parent.parent  # hf_headattn/
    code = space_code_files()  # the page's own modules, unchanged, laid out as in the package
    assert {"app/__init__.py", "app/page.py", "app/panels.py", "app/views.py", "translation/__init__.py",
            "translation/sentences.py", "decoding.py"} <= set(code)
    assert "loading.py" not in code and "app/space.py" not in code and not [name for name in code
                                                                            if name.startswith("runtime/")]
    assert sorted(path.relative_to(space / SPACE_PACKAGE).as_posix()
                  for path in (space / SPACE_PACKAGE).rglob("*.py")) == sorted(["__init__.py", *code])
    for module in code:
        assert (space / SPACE_PACKAGE / module).read_bytes() == (package / module).read_bytes()
    for name, folder in (("softmax-model", softmax), ("csparsemax", csparsemax)):
        copied = sorted(path.relative_to(space / "models" / name).as_posix()
                        for path in (space / "models" / name).glob("**/*") if path.is_file())
        assert copied == files_to_upload(folder) and "training_args.bin" not in copied
    app_py = (space / "app.py").read_text()
    assert "('softmax-model', 'models/softmax-model', True)" in app_py and "max_lines" in app_py
    assert not [path.name for path in space.parent.iterdir() if path.name.endswith(".partial")]


def test_the_space_runs_with_torch_transformers_and_gradio_alone(space, folders, data, tmp_path):
    """The Space's app.py served in a fresh interpreter where hf_headattn cannot be imported: the models load through
    their own code, and the page translates as the package does."""
    from gradio_client import Client

    port = free_port()
    script = WITHOUT_PACKAGE + textwrap.dedent("""
        import runpy
        runpy.run_path(sys.argv[1], run_name="__main__")
        """)
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    env.update(HF_HUB_OFFLINE="1", HF_MODULES_CACHE=str(tmp_path / "modules"), GRADIO_ANALYTICS_ENABLED="False",
               GRADIO_SERVER_NAME="127.0.0.1", GRADIO_SERVER_PORT=str(port), OMP_NUM_THREADS="1")
    log = (tmp_path / "space.log").open("w")
    server = subprocess.Popen([sys.executable, "-c", script, str(space / "app.py")], cwd=tmp_path, env=env,
                              stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 240
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=5)
                break
            except OSError:
                assert server.poll() is None, (tmp_path / "space.log").read_text()[-3000:]
                assert time.monotonic() < deadline, "the Space did not start in 240 s"
                time.sleep(1)
        sources = data["test.src"].read_text(encoding="utf-8").splitlines()[:2]
        outputs = Client(f"http://127.0.0.1:{port}/", verbose=False).predict(
            "\n".join(sources), 2, 1, 12, "softmax-model", "csparsemax", api_name="/translate")
    finally:
        server.terminate()
        server.wait(timeout=60)
        log.close()
    assert "not loaded" not in json.dumps(outputs), outputs
    first, size = len(PAGE_OUTPUTS) - 1, len(PANEL_OUTPUTS) - 1  # the states (gr.State) do not travel
    assert len(outputs) == first + 2 * size
    for k, folder in enumerate(folders):
        panel = dict(zip(PANEL_OUTPUTS, outputs[first + k * size:first + (k + 1) * size]))
        model, tokenizer = load_model_and_tokenizer(folder)
        for translation in translate(model, tokenizer, sources, num_beams=2, max_new_tokens=12):
            assert f'<span class="translation-text">{translation.text}</span>' in panel["translations"]
        assert 'class="hm-cell' in panel["heatmap"]
    assert "Traceback" not in (tmp_path / "space.log").read_text()


def test_the_code_a_space_needs_follows_relative_imports_through_subpackages(tmp_path):
    """What a Space copies: the page's package, each subpackage's __init__ a needed module sits in, and what they
    import relatively at any level (function-level imports too), but loading.py; never the runtime."""
    files = {"app/__init__.py": "from .page import build\n",
             "app/page.py": "from . import views\nfrom ..translation import translate\n\n\ndef build():\n"
                            "    from ..loading import load\n",
             "app/views.py": "", "translation.py": "from .tools.files import write\n", "tools/__init__.py": "",
             "tools/files.py": "", "loading.py": "from .runtime.modeling import Model\n", "unused.py": ""}
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    assert _code_closure(tmp_path, "app/__init__.py") == (
        ["app/__init__.py", "app/page.py", "app/views.py", "tools/__init__.py", "tools/files.py", "translation.py"], [])
    (tmp_path / "tools" / "files.py").unlink()
    assert _code_closure(tmp_path, "app/__init__.py")[1] == ["tools/files.py"]
    (tmp_path / "app" / "views.py").write_text("from ..runtime.modeling import Model\n")
    with pytest.raises(ValueError, match=r"app/views.py imports the runtime \(\.\.runtime\.modeling\)"):
        _code_closure(tmp_path, "app/__init__.py")
    (tmp_path / "app" / "views.py").write_text("from hf_headattn.translation import translate\n")
    with pytest.raises(ValueError, match="app/views.py imports hf_headattn by name"):
        _code_closure(tmp_path, "app/__init__.py")


def test_a_mistyped_run_folder_is_not_written_in_as_a_hub_id(folders, tmp_path, monkeypatch):
    """`runs/typo` has the form of a Hub id user/name, but `runs` is a folder here: a typo, refused as the
    commands refuse it."""
    (tmp_path / "runs").mkdir()
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError, match="model runs/typo: no such folder .*runs is a folder here.*check the path"):
        write_space([folders[0], "runs/typo"], "space")
    assert sorted(path.name for path in tmp_path.iterdir()) == ["runs"]


def test_bad_input_is_refused_before_anything_is_written(folders, tmp_path):
    softmax, _ = folders
    incomplete = shutil.copytree(softmax, tmp_path / "incomplete")
    (incomplete / "tokenizer.json").unlink()
    (incomplete / "attention_sparse.py").unlink()
    with pytest.raises(ValueError) as error:
        write_space([softmax, incomplete], tmp_path / "space")
    assert str(error.value).startswith(f"Cannot write the Space; missing: {incomplete}: runtime code file(s) "
                                       "attention_sparse.py")
    assert "a tokenizer (tokenizer_config.json and its vocabulary" in str(error.value)
    with pytest.raises(ValueError, match="is neither a model folder nor a Hub model id"):
        write_space([tmp_path / "not here" / "x y"], tmp_path / "space")
    with pytest.raises(ValueError, match="space lies inside the input .*model"):
        write_space([softmax], softmax / "space")
    with pytest.raises(ValueError, match="holds the input .*model: writing there would delete it"):
        write_space([softmax], softmax.parent, overwrite=True)  # data loss before issue 44
    assert (softmax / "model.safetensors").is_file()
    assert sorted(path.name for path in tmp_path.iterdir()) == ["incomplete"]  # nothing written, no staging left

    written = write_space([softmax, "someone/headattn-de-en"], tmp_path / "space")
    assert SpaceCard.load(written / "README.md").data.models == ["someone/headattn-de-en"]
    assert "('someone/headattn-de-en', 'someone/headattn-de-en', False)" in (written / "app.py").read_text()
    with pytest.raises(ValueError, match="exists; choose another folder or pass --overwrite"):
        write_space([softmax], written)
    write_space([softmax], written, overwrite=True)
    assert not (written / "models" / "someone").exists() and "someone" not in (written / "app.py").read_text()


@pytest.fixture
def fake_hub(monkeypatch, tmp_path):
    FakeHfApi.calls, FakeHfApi.remote = [], tmp_path / "remote"
    FakeHfApi.remote.mkdir()
    monkeypatch.setattr(upload, "HfApi", FakeHfApi)
    return FakeHfApi


def test_push_space_uploads_the_checked_files_as_a_gradio_space(space, tmp_path, fake_hub):
    local = shutil.copytree(space, tmp_path / "space")
    (local / SPACE_PACKAGE / "app" / "__pycache__").mkdir()  # what running it locally leaves behind stays home
    (local / SPACE_PACKAGE / "app" / "__pycache__" / "page.cpython-311.pyc").write_bytes(b"\0")
    (local / ".gradio").mkdir()
    (local / ".gradio" / "certificate.pem").write_text("x")
    assert push_space(local, "someone/headattn-demo", token="hf_secret", private=True) == "commit-info"
    calls = dict(fake_hub.calls)
    assert calls["create_repo"] == {"repo_id": "someone/headattn-demo", "private": True, "exist_ok": True,
                                    "repo_type": "space", "space_sdk": "gradio"}
    assert calls["upload_folder"]["repo_type"] == "space"
    uploaded = sorted(path.relative_to(fake_hub.remote).as_posix() for path in fake_hub.remote.glob("**/*")
                      if path.is_file())
    assert uploaded == check_space_folder(local)
    assert {"app.py", "requirements.txt", "README.md", f"{SPACE_PACKAGE}/app/page.py",
            "models/csparsemax/model.safetensors"} <= set(uploaded)
    assert not [name for name in uploaded if "__pycache__" in name or ".gradio" in name]

    (local / "models" / "csparsemax" / "config.json").unlink()
    (local / "requirements.txt").unlink()
    fake_hub.calls.clear()
    with pytest.raises(ValueError, match=r"is not a complete Space; missing: requirements.txt; "
                                         r"models/csparsemax: config.json"):
        push_space(local, "someone/headattn-demo")
    assert fake_hub.calls == []


def test_hub_command_writes_and_pushes_a_space(folders, tmp_path, fake_hub, capsys):
    softmax, _ = folders
    hub.main(["space", "--model", str(softmax), "--output-dir", str(tmp_path / "space"), "--title", "Toy demo"])
    assert capsys.readouterr().out.strip() == f"written: {tmp_path / 'space'}"
    assert SpaceCard.load(tmp_path / "space" / "README.md").data.title == "Toy demo"
    hub.main(["push", "--space", str(tmp_path / "space"), "--repo-id", "someone/toy-demo"])
    assert capsys.readouterr().out.strip() == "uploaded: commit-info"
    with pytest.raises(SystemExit) as exit_code:
        hub.main(["space", "--model", str(softmax), "--output_dir", str(tmp_path / "space")])
    assert exit_code.value.code == 1
    assert "exists; choose another folder or pass --overwrite" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        hub.main(["push", "--space", str(tmp_path / "space"), "--model", str(softmax), "--repo-id", "someone/x"])
    assert "not allowed with argument" in capsys.readouterr().err
