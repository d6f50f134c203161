"""Model cards from real evaluations parse back to the same numbers; push_to_hub uploads a complete folder (the Hub
is mocked), refuses an incomplete one, and the folder as uploaded loads through remote code without the package."""

import json
import os
import shutil
import subprocess
import sys
import textwrap

import pytest
import torch
from huggingface_hub import ModelCard
from huggingface_hub.errors import HFValidationError
from huggingface_hub.repocard import metadata_load
from huggingface_hub.repocard_data import model_index_to_eval_results
from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

from hf_headattn.commands import hub
from hf_headattn.evaluation import evaluate_model
from hf_headattn.publish import check_model_folder, files_to_upload, push_to_hub, upload, write_model_card

# single_thread is an autouse fixture: importing it makes it apply to this module too.
from helpers import WITHOUT_PACKAGE, FakeHfApi, toy_data, train_tiny_model


DATASET = dict(dataset_name="Toy German-English", dataset_id="hf-headattn/toy-de-en")
FAMILY_FLAGS = {  # a non-default variant in each family, so the card has something to describe
    "transformer": ["--cross_attention", '{"type": "multihop", "hops": 2, "layers": [-1]}'],
    "rnn": [],  # 2 heads x 2 dependent hops (test_evaluation.FAMILIES)
}
SENTENCES = ["der kleine hund sieht die katze .", "die frau lacht ."]
GENERATION = dict(max_new_tokens=8, do_sample=False)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return toy_data(tmp_path_factory.mktemp("data"))


@pytest.fixture(scope="module")
def evaluated(data, tmp_path_factory):
    """family -> (model folder, its evaluation with all five metrics, DROP included)."""
    result = {}
    for family, flags in FAMILY_FLAGS.items():
        folder = train_tiny_model(data, tmp_path_factory.mktemp(family), family, *flags)
        evaluation = evaluate_model(folder, data["test.src"], data["test.tgt"], num_beams=1, batch_size=16,
                                    device="cpu", train_source=data["train.src"], train_target=data["train.tgt"],
                                    output_dir=tmp_path_factory.mktemp(f"{family}-eval"), buckets=(5, 8))
        result[family] = folder, evaluation
    return result


@pytest.fixture
def carded(evaluated, tmp_path):
    """A copy of each evaluated folder with its model card, for tests that change the folder."""
    folders = {}
    for family, (folder, evaluation) in evaluated.items():
        copy = shutil.copytree(folder, tmp_path / folder.name)
        write_model_card(copy, evaluation, repo_id=f"someone/toy-{family}", **DATASET)
        folders[family] = copy
    return folders


# ------------------------------------------------------------------------------------------------ the card
@pytest.mark.parametrize("family", sorted(FAMILY_FLAGS))
def test_card_parses_back_to_the_evaluated_numbers(family, evaluated, tmp_path):
    folder, evaluation = evaluated[family]
    folder = shutil.copytree(folder, tmp_path / "model")
    metrics_json = evaluation["files"]["metrics"]  # the card is written from the JSON file on disk
    readme = write_model_card(folder, metrics_json, repo_id=f"someone/toy-{family}", license="apache-2.0",
                              limitations=["Trained for three optimizer steps: a test fixture, not a translator."],
                              **DATASET)
    assert readme == folder / "README.md"

    metadata = metadata_load(readme)
    model_name, results = model_index_to_eval_results(metadata["model-index"])
    assert model_name == f"toy-{family}"
    measured = {key: evaluation[key] for key in ("bleu", "chrf", "ter", "rep", "drop")}
    assert all(value is not None for value in measured.values())
    assert {result.metric_type: result.metric_value for result in results} == measured  # exactly, not rounded
    assert [result.metric_name for result in results] == ["BLEU", "chrF", "TER", "REP", "DROP"]
    for result in results:
        assert (result.task_type, result.dataset_type, result.dataset_name, result.dataset_split) == (
            "translation", "hf-headattn/toy-de-en", "Toy German-English", "test")
    assert results[0].metric_config == evaluation["metric_settings"]["bleu"]

    card = ModelCard.load(readme)  # the Hub library's own reading of the whole card
    assert card.data.eval_results == results
    assert (card.data.pipeline_tag, card.data.library_name, card.data.license) == ("translation", "transformers",
                                                                                   "apache-2.0")
    assert card.data.language == ["de", "en"] and card.data.datasets == ["hf-headattn/toy-de-en"]
    assert {"translation", "hf_headattn", evaluation["model"]["model_type"]} <= set(card.data.tags)

    text = card.text
    assert "{" + "repo_id" + "}" not in text and f'pipeline("translation", model="someone/toy-{family}"' in text
    row = (f"| Toy German-English, test | {evaluation['test_set']['sentences']} | "
           + " | ".join(f"{evaluation[key]:.2f}" for key in measured) + " |")
    assert row in text
    for bucket, scores in evaluation["bleu_by_length"].items():
        assert f"| {bucket} | {scores['count']} | {scores['bleu']:.2f} |" in text
    assert f"| {evaluation['examples'][0]['source']} | {evaluation['examples'][0]['hypothesis']} |" in text
    assert "- Trained for three optimizer steps" in text
    assert f"{evaluation['model']['parameters']:,} parameters" in text
    if family == "transformer":
        assert "A Marian-style Transformer" in text
        assert "Cross-attention: `softmax` in layer 0, `multihop` (hops=2) in layer 1." in text
        assert "*A Multi-Hop Attention for RNN based Neural Machine Translation*" in text
    else:
        assert "An attentional LSTM encoder-decoder" in text
        assert "Source attention: 2 heads x 2 hops (dependent hops), `general` scores, `softmax` weights." in text
        assert "coverage_penalty=0.2" in text


def test_card_leaves_out_what_was_not_measured(evaluated, tmp_path):
    folder, evaluation = evaluated["rnn"]
    folder = shutil.copytree(folder, tmp_path / "model")
    without_drop = {**evaluation, "drop": None}  # as evaluate_model writes it without an aligner corpus
    readme = write_model_card(folder, without_drop, dataset_name="Toy German-English")
    _, results = model_index_to_eval_results(metadata_load(readme)["model-index"])
    assert [result.metric_type for result in results] == ["bleu", "chrf", "ter", "rep"]
    assert results[0].dataset_type == "Toy German-English"  # no dataset id: the name stands in
    text = readme.read_text()
    assert "| not measured |" in text and 'model="model"' in text  # the folder's name when no repo_id is given


def test_card_errors(evaluated, tmp_path):
    transformer_folder, transformer_evaluation = evaluated["transformer"]
    rnn_folder, _ = evaluated["rnn"]
    folder = shutil.copytree(rnn_folder, tmp_path / "model")
    with pytest.raises(ValueError, match="The evaluation is of a 'headattn' model, but .* holds a 'headattn_rnn'"):
        write_model_card(folder, transformer_evaluation, **DATASET)
    with pytest.raises(ValueError, match="The evaluation lacks bleu_by_length, examples; write it with"):
        write_model_card(folder, {key: value for key, value in transformer_evaluation.items()
                                  if key not in ("bleu_by_length", "examples")}, **DATASET)
    with pytest.raises(FileNotFoundError, match="Evaluation JSON not found"):
        write_model_card(folder, tmp_path / "missing.json", **DATASET)
    with pytest.raises(ValueError, match="language must be a \\(source, target\\) pair"):
        write_model_card(transformer_folder, transformer_evaluation, language="de", **DATASET)
    template = tmp_path / "template.md"
    template.write_text("---\n{metadata}\n---\n# {model_name}\n{license_text}\n")
    with pytest.raises(ValueError, match=r"placeholder\(s\) \{license_text\} that write_model_card does not fill"):
        write_model_card(transformer_folder, transformer_evaluation, template=template, **DATASET)
    assert not (transformer_folder / "README.md").exists()


# ------------------------------------------------------------------------------------------------ upload
@pytest.fixture
def fake_hub(monkeypatch, tmp_path):
    FakeHfApi.calls, FakeHfApi.remote = [], tmp_path / "remote"
    FakeHfApi.remote.mkdir()
    monkeypatch.setattr(upload, "HfApi", FakeHfApi)
    return FakeHfApi


def test_push_uploads_model_tokenizer_code_pipeline_and_card(carded, fake_hub):
    folder = carded["transformer"]
    assert push_to_hub(folder, "someone/toy-transformer", token="hf_secret", private=True) == "commit-info"
    calls = dict(fake_hub.calls)
    assert calls["init"] == {"token": "hf_secret"}
    assert calls["create_repo"] == {"repo_id": "someone/toy-transformer", "private": True, "exist_ok": True,
                                    "repo_type": "model"}
    assert calls["upload_folder"]["folder_path"] == str(folder)
    assert calls["upload_folder"]["repo_id"] == "someone/toy-transformer"

    uploaded = sorted(path.relative_to(fake_hub.remote).as_posix() for path in fake_hub.remote.glob("**/*")
                      if path.is_file())
    assert uploaded == files_to_upload(folder) == check_model_folder(folder)
    code = {name for name in uploaded if name.endswith(".py")}
    assert {"configuration_headattn.py", "modeling_headattn.py", "pipeline_headattn.py", "attention_sparse.py"} <= code
    assert set(uploaded) - code == {"README.md", "config.json", "generation_config.json", "model.safetensors",
                                    "tokenizer.json", "tokenizer_config.json", "train_results.json"}
    # the training command's byproduct stays home
    assert (folder / "training_args.bin").is_file()


def test_push_warns_when_the_card_names_another_repository(carded, fake_hub):
    with pytest.warns(UserWarning, match="do not name 'someone/elsewhere'; rewrite it with"):
        push_to_hub(carded["rnn"], "someone/elsewhere")


def test_incomplete_folder_is_refused_before_anything_is_created(carded, fake_hub):
    folder = carded["transformer"]
    (folder / "README.md").unlink()
    (folder / "attention_sparse.py").unlink()
    (folder / "tokenizer.json").unlink()
    config = json.loads((folder / "config.json").read_text())
    del config["auto_map"]["AutoModelForSeq2SeqLM"]
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError) as error:
        push_to_hub(folder, "someone/toy-transformer")
    message = str(error.value)
    assert message.startswith(f"{folder} is not ready to upload; missing: ")
    for problem in ("config.json auto_map entry AutoModelForSeq2SeqLM", "runtime code file(s) attention_sparse.py",
                    "re-save the model with save_pretrained", "tokenizer vocabulary (tokenizer.json or",
                    "README.md (write the model card"):
        assert problem in message
    assert fake_hub.calls == []  # nothing reached the Hub

    (folder / "model.safetensors").unlink()
    (folder / "README.md").write_text("# a card without metadata\n")
    with pytest.raises(ValueError, match=r"weights as model\.safetensors.*README\.md metadata"):
        check_model_folder(folder)
    with pytest.raises(FileNotFoundError, match="Model folder not found"):
        check_model_folder(folder / "nowhere")
    with pytest.raises(HFValidationError):
        push_to_hub(carded["rnn"], "not a/valid/repo id")
    assert fake_hub.calls == []


def test_hub_command_writes_the_card_and_pushes(evaluated, fake_hub, tmp_path, capsys):
    folder, evaluation = evaluated["rnn"]
    folder = shutil.copytree(folder, tmp_path / "model")
    hub.main(["card", "--model", str(folder), "--evaluation", evaluation["files"]["metrics"],
              "--dataset_name", "Toy German-English", "--language", "de", "en", "--repo_id", "someone/toy",
              "--limitation", "Only a test."])
    assert "- Only a test." in (folder / "README.md").read_text()
    hub.main(["push", "--model", str(folder), "--repo_id", "someone/toy", "--private"])
    assert capsys.readouterr().out.splitlines()[-2:] == [f"written: {folder / 'README.md'}", "uploaded: commit-info"]
    assert dict(fake_hub.calls)["create_repo"]["private"] is True


# ------------------------------------------------------------------------------------------------ as uploaded
# Runs in a fresh interpreter, with hf_headattn made unimportable, in a folder of its own.
FRESH_PROCESS_SCRIPT = WITHOUT_PACKAGE + textwrap.dedent(
    """
    from huggingface_hub.repocard import metadata_load
    from huggingface_hub.repocard_data import model_index_to_eval_results
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer, pipeline

    folders, sentences, generation = json.loads(sys.argv[1]), json.loads(sys.argv[2]), json.loads(sys.argv[3])
    results = {}
    for name, folder in folders.items():
        model = AutoModelForSeq2SeqLM.from_pretrained(folder, trust_remote_code=True).eval()
        tokenizer = AutoTokenizer.from_pretrained(folder, trust_remote_code=True)
        batch = tokenizer(sentences, return_tensors="pt", padding=True)
        translator = pipeline("translation", model=folder, trust_remote_code=True)
        _, eval_results = model_index_to_eval_results(metadata_load(folder + "/README.md")["model-index"])
        results[name] = {
            "module": type(model).__module__,
            "generate": model.generate(**batch, num_beams=2, **generation).tolist(),
            "pipeline": translator(sentences, num_beams=2, **generation),
            "card": {result.metric_type: result.metric_value for result in eval_results},
        }
    print()
    print("RESULT" + json.dumps(results))
    """
)


def test_folder_as_uploaded_loads_through_remote_code_without_the_package(evaluated, carded, fake_hub, tmp_path):
    uploaded = {}
    for family, folder in carded.items():
        fake_hub.remote = tmp_path / f"hub-{family}"  # what the Hub would hold after the upload
        fake_hub.remote.mkdir()
        push_to_hub(folder, f"someone/toy-{family}")
        uploaded[family] = str(fake_hub.remote)
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    env.update(HF_HUB_OFFLINE="1", HF_MODULES_CACHE=str(tmp_path / "modules"), OMP_NUM_THREADS="1")
    done = subprocess.run(
        [sys.executable, "-c", FRESH_PROCESS_SCRIPT, json.dumps(uploaded), json.dumps(SENTENCES),
         json.dumps(GENERATION)],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    fresh = json.loads(next(line for line in done.stdout.splitlines() if line.startswith("RESULT"))[len("RESULT"):])

    for family, folder in carded.items():
        assert fresh[family]["module"].startswith("transformers_modules")
        model = AutoModelForSeq2SeqLM.from_pretrained(folder, trust_remote_code=True).eval()
        tokenizer = AutoTokenizer.from_pretrained(folder, trust_remote_code=True)
        batch = tokenizer(SENTENCES, return_tensors="pt", padding=True)
        with torch.no_grad():
            assert fresh[family]["generate"] == model.generate(**batch, num_beams=2, **GENERATION).tolist()
        texts = [item["translation_text"] for item in fresh[family]["pipeline"]]
        assert texts == [text.strip() for text in tokenizer.batch_decode(fresh[family]["generate"],
                                                                          skip_special_tokens=True)]
        evaluation = evaluated[family][1]
        assert fresh[family]["card"] == {key: evaluation[key] for key in ("bleu", "chrf", "ter", "rep", "drop")}
