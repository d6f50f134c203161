"""The tools run a model's own code only when they may (local folders, or Hub ids with --trust_remote_code), and the
Hub upload sends only what a user of the model needs, never pickle weights (issue 17, item 5)."""

import warnings
from pathlib import Path

import pytest
import transformers
from huggingface_hub.utils import filter_repo_objects

from hf_headattn import HeadAttnForConditionalGeneration, publish
from hf_headattn.commands import plot
from hf_headattn.publish import upload
from hf_headattn.loading import load_model_and_tokenizer, remote_code_allowed
from hf_headattn.tokenization import train_tokenizer

from helpers import load_example, tiny_config


HUB_ID = "someone/untrusted-model"


class Loaded(Exception):
    """Raised by the stand-in from_pretrained: the loading got that far, with these arguments."""


@pytest.fixture
def loads(monkeypatch):
    """Replace AutoModelForSeq2SeqLM / AutoTokenizer.from_pretrained; returns the list of their calls' kwargs."""
    calls = []

    def from_pretrained(name_or_path, **kwargs):
        calls.append({"name": str(name_or_path), **kwargs})
        raise Loaded

    for auto_class in (transformers.AutoModelForSeq2SeqLM, transformers.AutoTokenizer):
        monkeypatch.setattr(auto_class, "from_pretrained", from_pretrained)
    return calls


def test_hub_ids_need_the_flag_local_folders_do_not(tmp_path):
    with pytest.raises(ValueError, match=rf"'{HUB_ID}' is not a local folder.*pass --trust_remote_code"):
        remote_code_allowed(HUB_ID)
    with pytest.raises(ValueError, match="check the path"):
        remote_code_allowed(tmp_path / "mistyped-folder")
    assert remote_code_allowed(HUB_ID, trust_remote_code=True)
    assert remote_code_allowed(tmp_path)  # a folder on the user's disk
    assert remote_code_allowed(str(tmp_path))


def test_load_model_and_tokenizer_checks_before_downloading(loads, tmp_path):
    with pytest.raises(ValueError, match="--trust_remote_code"):
        load_model_and_tokenizer(HUB_ID)
    assert loads == []  # nothing was fetched
    with pytest.raises(Loaded):
        load_model_and_tokenizer(HUB_ID, trust_remote_code=True)
    HeadAttnForConditionalGeneration(tiny_config()).save_pretrained(tmp_path)  # a whole folder: its files pass
    train_tokenizer(texts=["ein hund läuft ."], vocab_size=64, save_directory=tmp_path)  # the checks before loading
    with pytest.raises(Loaded):
        load_model_and_tokenizer(tmp_path)
    assert [call["trust_remote_code"] for call in loads] == [True, True]


@pytest.mark.parametrize("command", ["attention-map", "head-importances"])
def test_plotting_command_asks_before_running_hub_code(command, loads, capsys, tmp_path):
    arguments = [command, "--model", HUB_ID, "--sentence", "ein hund .", "--output", str(tmp_path / "x.png")]
    with pytest.raises(SystemExit) as exited:
        plot.main(arguments)
    assert exited.value.code == 2 and loads == []
    assert f"'{HUB_ID}' is not a local folder" in capsys.readouterr().err
    with pytest.raises(Loaded):
        plot.main([*arguments, "--trust-remote-code"])  # the dashed alias of --trust_remote_code
    assert loads == [{"name": HUB_ID, "trust_remote_code": True}]


def test_head_pruning_example_asks_before_running_hub_code(loads, capsys, tmp_path):
    example = load_example("dhicm_head_pruning")
    with pytest.raises(SystemExit):
        example.main(["--model", HUB_ID, "--output-dir", str(tmp_path / "pruned"), "--data-dir", str(tmp_path)])
    assert "--trust_remote_code" in capsys.readouterr().err and loads == []


# ------------------------------------------------------------------------------------------------ upload
def _complete_folder(folder: Path) -> Path:
    """A folder check_model_folder accepts: a saved tiny model (safetensors, code), a tokenizer's two files (their
    presence is what is checked) and a card with metadata."""
    HeadAttnForConditionalGeneration(tiny_config()).save_pretrained(folder)
    (folder / "tokenizer.json").write_text("{}")
    (folder / "tokenizer_config.json").write_text("{}")
    (folder / "README.md").write_text('---\nlicense: apache-2.0\n---\n# toy\nAutoModel... "someone/toy"\n')
    return folder


class RecordingHfApi:
    """huggingface_hub.HfApi stand-in: what upload_folder would send, filtered as upload_folder filters."""

    sent: list = []

    def __init__(self, token=None):
        pass

    def create_repo(self, repo_id, **kwargs):
        return type("RepoUrl", (), {"repo_id": repo_id})()

    def upload_folder(self, *, folder_path, allow_patterns=None, ignore_patterns=None, **kwargs):
        folder = Path(folder_path)
        files = [path.relative_to(folder).as_posix() for path in sorted(folder.glob("**/*")) if path.is_file()]
        RecordingHfApi.sent = list(filter_repo_objects(files, allow_patterns=allow_patterns,
                                                       ignore_patterns=ignore_patterns))
        return "commit-info"


def test_upload_sends_only_what_users_need_and_names_the_rest(tmp_path, monkeypatch):
    folder = _complete_folder(tmp_path / "model")
    stray = ["notes.txt", "pytorch_model.bin", "training_args.bin", "checkpoint-3/model.safetensors",
             "tokenizer/tokenizer.json", "my_script.py", "secrets.env"]
    for name in stray:
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text("not for the Hub")
    uploaded = publish.check_model_folder(folder)
    assert publish.files_left_out(folder) == sorted(stray)
    assert set(uploaded) == set(publish.files_to_upload(folder))
    code = {name for name in uploaded if name.endswith(".py")}
    assert {"configuration_headattn.py", "modeling_headattn.py", "pipeline_headattn.py", "sparse_attention.py"} <= code
    assert set(uploaded) - code == {"config.json", "generation_config.json", "model.safetensors", "tokenizer.json",
                                    "tokenizer_config.json", "README.md"}

    monkeypatch.setattr(upload, "HfApi", RecordingHfApi)
    # Trainer's byproducts (training_args.bin, checkpoint-*/) stay home without a word; the rest is named
    with pytest.warns(UserWarning, match=r"Not uploading 5 file\(s\) .*: my_script\.py, notes\.txt, "
                                         r"pytorch_model\.bin, secrets\.env, tokenizer/tokenizer\.json$"):
        publish.push_to_hub(folder, "someone/toy")
    assert RecordingHfApi.sent == uploaded


def test_pickle_only_weights_are_refused(tmp_path):
    folder = _complete_folder(tmp_path / "model")
    (folder / "model.safetensors").rename(folder / "pytorch_model.bin")  # stands in for torch.save'd weights
    with pytest.raises(ValueError, match=r"missing: weights as model\.safetensors \(the folder has only pickle "
                                         r"weights, pytorch_model\.bin, which can run arbitrary code"):
        publish.check_model_folder(folder)
    (folder / "pytorch_model.bin").unlink()
    with pytest.raises(ValueError, match=r"missing: weights as model\.safetensors(;|$)"):
        publish.check_model_folder(folder)


def test_a_complete_folder_uploads_without_a_warning(tmp_path, monkeypatch):
    folder = _complete_folder(tmp_path / "model")
    monkeypatch.setattr(upload, "HfApi", RecordingHfApi)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert publish.push_to_hub(folder, "someone/toy") == "commit-info"
    assert publish.files_left_out(folder) == [] and RecordingHfApi.sent == publish.files_to_upload(folder)


# ------------------------------------------------------------------------------------------------ issue 32, item 8
def test_symbolic_links_out_of_the_folder_are_never_followed(tmp_path, monkeypatch):
    folder = _complete_folder(tmp_path / "model")
    secret = tmp_path / "elsewhere.txt"
    secret.write_text("a file of this machine")
    (folder / "notes.txt").symlink_to(secret)
    monkeypatch.setattr(upload, "HfApi", RecordingHfApi)
    with pytest.warns(UserWarning, match=rf"Not uploading symbolic links out of .*: notes\.txt -> {secret}"):
        publish.push_to_hub(folder, "someone/toy")
    assert "notes.txt" not in RecordingHfApi.sent and "notes.txt" not in publish.files_left_out(folder)

    (folder / "tokenizer.json").unlink()  # a file the model needs, as a link out
    (folder / "tokenizer.json").symlink_to(secret)
    with pytest.raises(ValueError, match=rf"tokenizer\.json as a file of the folder \(it is a symbolic link to "
                                         rf"{secret}, outside it; copy the file in\)"):
        publish.check_model_folder(folder)


def test_files_that_look_like_secrets_are_warned_about(tmp_path, monkeypatch):
    folder = _complete_folder(tmp_path / "model")
    with open(folder / "README.md", "a") as card:
        card.write("\nlogin with HF_TOKEN=hf_" + "a1B2" * 9 + "\n")
    monkeypatch.setattr(upload, "HfApi", RecordingHfApi)
    with pytest.warns(UserWarning, match=r"Files to upload look like they hold secrets: README\.md, line 7: a Hugging "
                                         r"Face token\. Remove them"):
        publish.push_to_hub(folder, "someone/toy")


def test_a_repository_id_is_validated_before_it_is_written_into_a_card(tmp_path):
    folder = _complete_folder(tmp_path / "model")
    (folder / "README.md").unlink()
    evaluation = {"bleu": 1.0, "chrf": 2.0, "ter": 3.0, "bleu_by_length": {},
                  "model": {"model_type": "headattn", "parameters": 1}, "test_set": {"name": "test", "sentences": 1},
                  "decoding": {"num_beams": 1, "batch_size": 1, "max_length": 8, "device": "cpu"},
                  "examples": [{"source": "a", "reference": "b", "hypothesis": "c"}]}
    with pytest.raises(ValueError, match=r"repo_id 'not a/valid id' is not a Hub repository id"):
        publish.write_model_card(folder, evaluation, dataset_name="toy", repo_id="not a/valid id")
    assert not (folder / "README.md").exists()
    with pytest.raises(ValueError, match="Repo id must"):
        publish.push_to_hub(folder, "not a/valid id")


def test_a_folder_whose_tokenizer_is_not_its_models_is_not_uploaded(tmp_path):
    from hf_headattn.training.run_manifest import write_manifest
    from hf_headattn.tokenization import tokenizer_fingerprint, train_tokenizer

    folder = _complete_folder(tmp_path / "model")
    trained, other = (train_tokenizer(texts=texts, vocab_size=40) for texts in (["ein hund ."], ["a cat ."]))
    other.save_pretrained(folder)
    write_manifest(folder, {"format": 1, "identity": {"tokenizer": {"sha256": tokenizer_fingerprint(trained)}}})
    with pytest.raises(ValueError, match=r"missing: the tokenizer the model was trained with \(the tokenizer of "):
        publish.check_model_folder(folder)
    trained.save_pretrained(folder)
    publish.check_model_folder(folder)
