"""Every damaged input named (issue 44, items 2, 5 and 6), fault injection through the commands' `main(argv)`:

* text is read one way by every command (`parallel_data.read_lines`): "\\n", "\\r\\n" and a lone "\\r" end a line, a
  byte-order mark is dropped, bytes that are not UTF-8 are named by file, line and byte;
* count-like flags, metrics JSON and training data too small to train on are refused, naming the flag, field or
  file and what is accepted, before any work;
* a `--model` written as a path that names no folder is refused by every command that takes one (it would be taken
  for a Hub id).
"""

import io
import json
import re
import sys

import pytest

from hf_headattn import parallel_data, tokenization, translation
from hf_headattn.commands import app, average, demo, evaluate, export, hub, plot
from hf_headattn.commands import translate as translate_command
from hf_headattn.evaluation import evaluate_model
from hf_headattn.training import train
from hf_headattn.training.run_folder import RunRefused

from helpers import N_TEST, toy_data, train_tiny_model


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return toy_data(tmp_path_factory.mktemp("data"))


@pytest.fixture(scope="module")
def model(data, tmp_path_factory):
    return train_tiny_model(data, tmp_path_factory.mktemp("model") / "model", "transformer")


@pytest.fixture(scope="module")
def evaluation(data, model, tmp_path_factory):
    """An evaluation JSON of `model`, as hf-headattn-evaluate writes it."""
    results = evaluate_model(model, data["test.src"], data["test.tgt"], num_beams=1, device="cpu",
                             output_dir=tmp_path_factory.mktemp("eval"), buckets=(5,))
    return results["files"]["metrics"]


def refused(main, argv, capsys, code=2) -> str:
    """`main(argv)` exits with `code` (argparse's usage error: 2) before any work; its error output."""
    with pytest.raises(SystemExit) as exit_info:
        main([str(argument) for argument in argv])
    assert exit_info.value.code == code
    return capsys.readouterr().err


def with_line_ends(lines: list[str], end: str, bom: bool = False) -> bytes:
    return ("\ufeff" * bom + "".join(line + end for line in lines)).encode("utf-8")


# ------------------------------------------------------------------------------------------------ text read one way
def test_every_command_reads_text_through_the_one_reader():
    assert translation.read_lines is parallel_data.read_lines  # the translation command's, and the library's


def test_translate_reads_classic_mac_and_windows_files_as_their_lines(model, data, tmp_path):
    """A "\\r"-only file was one sentence cut at the length limit, translated with exit 0."""
    lines = data["test.src"].read_text(encoding="utf-8").splitlines()[:4]  # the toy corpus ends lines with "\n"
    outputs = {}
    for name, content in (("unix", with_line_ends(lines, "\n")), ("mac", with_line_ends(lines, "\r")),
                          ("windows-bom", with_line_ends(lines, "\r\n", bom=True))):
        (tmp_path / f"{name}.de").write_bytes(content)
        translate_command.main(["--model", str(model), "--input", str(tmp_path / f"{name}.de"), "--output",
                                str(tmp_path / f"{name}.en"), "--num_beams", "1", "-q"])
        outputs[name] = (tmp_path / f"{name}.en").read_text(encoding="utf-8")
    assert len(outputs["unix"].splitlines()) == 4
    assert outputs["mac"] == outputs["windows-bom"] == outputs["unix"]


def test_translate_names_the_line_and_byte_of_standard_input_that_is_not_utf8(model, monkeypatch, capsys):
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"gut\rDrei M\xe4nner\n")))
    error = refused(translate_command.main, ["--model", model], capsys, code=1)
    assert "<stdin>, line 2: not UTF-8 (byte 0xe4 at character 7); convert the file to UTF-8" in error


def test_evaluate_reads_test_sets_as_training_reads_its_data(model, data, tmp_path, capsys):
    references = data["test.tgt"].read_text(encoding="utf-8").splitlines()
    (tmp_path / "test.de").write_bytes(data["test.src"].read_bytes().replace(b"\n", b"\r"))
    (tmp_path / "test.en").write_bytes(with_line_ends(references, "\r\n", bom=True))
    evaluate.main(["--model", str(model), "--source", str(tmp_path / "test.de"), "--reference",
                   str(tmp_path / "test.en"), "--output_dir", str(tmp_path / "eval"), "--num_beams", "1",
                   "--device", "cpu", "--json"])
    results = json.loads(capsys.readouterr().out)
    assert results["test_set"]["sentences"] == N_TEST
    assert [example["reference"] for example in results["examples"]] == references[:3]

    (tmp_path / "latin1.en").write_bytes("\n".join(references[:-1] + ["Drei Männer"]).encode("latin-1"))
    error = refused(evaluate.main, ["--model", str(model), "--source", str(data["test.src"]), "--reference",
                                    str(tmp_path / "latin1.en"), "--output_dir", str(tmp_path / "eval2"),
                                    "--device", "cpu"], capsys, code=1)
    assert re.search(rf"latin1\.en, line {N_TEST}: not UTF-8 \(byte 0xe4 at character 7\)", error), error


def test_tokenizer_training_files_are_read_as_the_training_command_reads_them(data, tmp_path):
    lines = data["train.src"].read_text(encoding="utf-8").splitlines()
    (tmp_path / "mac.de").write_bytes(with_line_ends(lines, "\r", bom=True))
    unix = tokenization.train_tokenizer(files=[data["train.src"]], vocab_size=120)
    mac = tokenization.train_tokenizer(files=[tmp_path / "mac.de"], vocab_size=120)
    assert mac.get_vocab() == unix.get_vocab()  # "\ufeff" was a token and "\r" a character inside sentences
    (tmp_path / "latin1.de").write_bytes("eins\nDrei Männer\n".encode("latin-1"))
    with pytest.raises(ValueError, match=r"latin1\.de, line 2: not UTF-8 \(byte 0xe4 at character 7\)"):
        tokenization.train_tokenizer(files=[tmp_path / "latin1.de"], vocab_size=120)


def test_the_web_pages_text_box_ends_lines_where_a_file_does():
    from hf_headattn.app.panels import split_lines

    lines, _ = split_lines("\ufeffein hund\u2028läuft .\rzwei katzen\r\n\x0cdrei\n")  # str.splitlines made 5 lines
    assert lines == [(1, "ein hund\u2028läuft ."), (2, "zwei katzen"), (3, "drei")]


# ------------------------------------------------------------------------------------------------ counts and numbers
# (command, its words, the error): refused while parsing, before any model loads
BAD_NUMBERS = [
    ("translate-top-p", translate_command.main, ["--top_p", "1.5"],  # Transformers ignored top_p >= 1
     "argument --top_p: '1.5' is not a number in (0, 1]"),
    ("translate-temperature", translate_command.main, ["--temperature", "0"],  # refused by generate, after loading
     "argument --temperature: '0' is not a finite number > 0"),
    ("translate-length-penalty", translate_command.main, ["--length_penalty", "nan"],  # decoded with NaN scores
     "argument --length_penalty: 'nan' is not a finite number"),
    ("translate-ngrams", translate_command.main, ["--no_repeat_ngram_size", "-1"],  # ignored
     "argument --no_repeat_ngram_size: '-1' is not a whole number >= 0"),
    ("translate-top-k", translate_command.main, ["--top_k", "-1"], "argument --top_k: '-1' is not a whole number >= 0"),
    ("translate-seed", translate_command.main, ["--seed", "-1"],  # numpy's error after loading
     "argument --seed: '-1' is not a whole number in [0, 4294967295]"),
    ("translate-beams", translate_command.main, ["--num_beams", "two"], "argument --num_beams: 'two' is not a whole"),
    ("evaluate-coverage", evaluate.main, ["--source", "s", "--reference", "r", "--output_dir", "o",
                                          "--coverage_penalty", "nan"],  # accepted, and decoded with
     "argument --coverage_penalty: 'nan' is not a finite number >= 0"),
    ("evaluate-batch", evaluate.main, ["--source", "s", "--reference", "r", "--output_dir", "o", "--batch_size", "0"],
     "argument --batch_size: '0' is not a whole number >= 1"),
    ("plot-beams", lambda argv: plot.main(["attention-map", *argv, "--sentence", "x", "--output", "x.png"]),
     ["--num_beams", "0"], "argument --num_beams: '0' is not a whole number >= 1"),  # ZeroDivisionError after loading
    ("demo-epochs", demo.main, ["--epochs", "0"], "argument --epochs: '0' is not a finite number > 0"),
]


@pytest.mark.parametrize("main, argv, message", [case[1:] for case in BAD_NUMBERS], ids=[c[0] for c in BAD_NUMBERS])
def test_a_count_or_number_out_of_range_is_refused_with_the_range_before_any_work(main, argv, message, model, capsys):
    assert message in refused(main, ["--model", model, *argv] if main is not demo.main else argv, capsys)


def test_average_refuses_zero_checkpoints_with_the_range(tmp_path, capsys):
    error = refused(average.main, ["--last", "0", tmp_path, "--output_dir", tmp_path / "avg"], capsys)
    assert "--last N RUN_DIR: N must be a positive whole number, got '0'" in error


# ------------------------------------------------------------------------------------------------ training data
@pytest.fixture
def no_tokenizer_training(monkeypatch):
    monkeypatch.setattr(tokenization, "train_tokenizer", lambda *args, **kwargs: pytest.fail("trained a tokenizer"))


def train_on(files: dict, output_dir) -> list[str]:
    argv = ["--d_model", "32", "--layers", "1", "--heads", "2", "--ffn_dim", "64", "--vocab_size", "100",
            "--max_steps", "1", "--output_dir", str(output_dir)]
    for flag, path in files.items():
        argv += [f"--{flag}", str(path)]
    return argv


@pytest.mark.parametrize("validation, message", [
    (b"", r"no sentence pair to validate on: 0 line\(s\) read; give validation files of sentence pairs, or none"),
    (b"\n  \n", r"no sentence pair to validate on: 2 line\(s\) read \(2 with a blank side, skipped\)"),
], ids=["empty", "blank"])
def test_validation_files_without_a_pair_are_refused_naming_them(validation, message, data, tmp_path,
                                                                 no_tokenizer_training):
    """Trainer's evaluation failed deep inside `datasets` ("Column 'truncated' doesn't exist")."""
    for name in ("valid.de", "valid.en"):
        (tmp_path / name).write_bytes(validation)
    files = {"train_source": data["train.src"], "train_target": data["train.tgt"],
             "valid_source": tmp_path / "valid.de", "valid_target": tmp_path / "valid.en"}
    with pytest.raises(RunRefused, match=rf"valid\.de / .*valid\.en: {message}"):
        train(train_on(files, tmp_path / "run"))


def test_one_pair_without_validation_files_is_refused_saying_what_to_give(data, tmp_path, no_tokenizer_training):
    """The 5% held out left nothing: `datasets`' "test_size=1 should be either positive and smaller than ..."."""
    (tmp_path / "one.de").write_text("ein hund .\n", encoding="utf-8")
    (tmp_path / "one.en").write_text("a dog .\n", encoding="utf-8")
    with pytest.raises(RunRefused, match=r"one\.de / .*one\.en: one sentence pair and no validation data; .* give "
                                         r"validation files, or more pairs"):
        train(train_on({"train_source": tmp_path / "one.de", "train_target": tmp_path / "one.en"}, tmp_path / "run"))


def test_a_training_corpus_of_blank_pairs_is_refused_naming_its_files(data, tmp_path, no_tokenizer_training):
    """The tokenizer trainer said "The training corpus is empty", naming no file, after a traceback."""
    (tmp_path / "holes.de").write_text("\n\nein hund .\n", encoding="utf-8")
    (tmp_path / "holes.en").write_text("a dog .\n\n \n", encoding="utf-8")
    with pytest.raises(RunRefused, match=r"holes\.de / .*holes\.en: no sentence pair to train on: 3 line\(s\) read "
                                         r"\(3 with a blank side, skipped\)"):
        train(train_on({"train_source": tmp_path / "holes.de", "train_target": tmp_path / "holes.en"},
                       tmp_path / "run"))


# ------------------------------------------------------------------------------------------------ metrics JSON
def damaged(evaluation_path, tmp_path, change) -> str:
    """A copy of the evaluation JSON whose text `change` rewrites."""
    text = change(open(evaluation_path, encoding="utf-8").read())
    (tmp_path / "damaged.json").write_text(text, encoding="utf-8")
    return str(tmp_path / "damaged.json")


def with_value(text: str, value, *keys) -> str:
    """The JSON `text` with the field at `keys` set to `value` (json.dumps writes NaN and Infinity as such)."""
    results = json.loads(text)
    inner = results
    for key in keys[:-1]:
        inner = inner[key]
    inner[keys[-1]] = value
    return json.dumps(results)


METRICS_DAMAGE = [
    ("cut-short", lambda text: text[:200],
     r"damaged\.json, line \d+ column \d+ \(character \d+\): not JSON \((Expecting|Unterminated)"),
    ("nan-bleu", lambda text: with_value(text, float("nan"), "bleu"),  # the card said `value: .nan`
     r"damaged\.json: bleu is nan, not a finite number"),
    ("infinite-bucket", lambda text: with_value(text, float("inf"), "bleu_by_length", "<5", "bleu"),
     r"damaged\.json: bleu_by_length\.<5\.bleu is inf, not a finite number"),
]


@pytest.mark.parametrize("change, message", [case[1:] for case in METRICS_DAMAGE], ids=[c[0] for c in METRICS_DAMAGE])
def test_a_damaged_metrics_json_is_refused_by_the_card_and_the_plot_before_anything_is_written(
        change, message, evaluation, model, tmp_path, capsys):
    path = damaged(evaluation, tmp_path, change)
    error = refused(hub.main, ["card", "--model", model, "--evaluation", path, "--dataset_name", "toy"], capsys, 1)
    assert "hf-headattn-hub card: error: " in error and re.search(message, error), error
    assert not (model / "README.md").exists()
    error = refused(plot.main, ["bleu-by-length", "--results", path, "--output", tmp_path / "plot.png"], capsys, 1)
    assert "hf-headattn-plot bleu-by-length: error: " in error and re.search(message, error), error
    assert not (tmp_path / "plot.png").exists()


@pytest.mark.parametrize("field, value, message", [
    ("model", {"name": "m", "model_type": "headattn"}, "The evaluation lacks model.parameters; write it with"),
    ("bleu", "36.5", "The evaluation's bleu is '36.5'; a card needs a number there"),
    ("examples", [{"source": "s", "hypothesis": "h"}], "The evaluation's examples.0.reference is None; a card needs "
                                                        "text there"),
], ids=["missing-nested-field", "text-score", "example-without-reference"])
def test_a_card_names_the_field_of_the_evaluation_it_lacks(field, value, message, evaluation, model, tmp_path, capsys):
    path = damaged(evaluation, tmp_path, lambda text: with_value(text, value, field))
    error = refused(hub.main, ["card", "--model", model, "--evaluation", path, "--dataset_name", "toy"], capsys, 1)
    assert message in error  # a KeyError or a format error's traceback before
    assert not (model / "README.md").exists()


# ------------------------------------------------------------------------------------------------ --model as a path
# every command that takes --model, with the other words it needs; a mistyped folder must not be taken for a Hub id
MODEL_COMMANDS = {
    "translate": (translate_command.main, []),
    "evaluate": (evaluate.main, ["--source", "s", "--reference", "r", "--output_dir", "o"]),
    "plot attention-map": (lambda argv: plot.main(["attention-map", *argv]), ["--sentence", "x", "--output", "x.png"]),
    "plot head-importances": (lambda argv: plot.main(["head-importances", *argv]),
                              ["--sentence", "x", "--output", "x.png"]),
    "export": (export.main, ["--format", "ctranslate2", "--output_dir", "ct2"]),
    "hub card": (lambda argv: hub.main(["card", *argv]), ["--evaluation", "e.json", "--dataset_name", "toy"]),
    "hub push": (lambda argv: hub.main(["push", *argv]), ["--repo_id", "someone/model"]),
    "hub space": (lambda argv: hub.main(["space", *argv]), ["--output_dir", "space"]),
    "app": (app.main, []),
}


@pytest.mark.parametrize("command", sorted(MODEL_COMMANDS))
def test_a_model_path_that_names_no_folder_is_refused_by_every_command(command, model, tmp_path, monkeypatch,
                                                                       capsys):
    main, other_words = MODEL_COMMANDS[command]
    monkeypatch.chdir(tmp_path)  # where the commands' own outputs would go
    mistyped = f"{model.parent}/modle"  # written as a path: the Space wrote it in as a Hub id to download
    error = refused(main, ["--model", mistyped, *other_words], capsys)
    assert re.search(rf"error: --model {mistyped}: no such folder \((it is written as a path, not as a Hub id "
                     r"user/name|a saved model folder is needed here)\); check the path", error), error
    assert list(tmp_path.iterdir()) == []  # no Space, no export, no plot


def test_a_hub_id_whose_namespace_is_a_folder_here_is_a_mistyped_path(model, tmp_path, monkeypatch, capsys):
    from hf_headattn.cli import model_path_problem

    assert model_path_problem("someone/de-en") is None  # a Hub id, to be downloaded
    (tmp_path / "runs").mkdir()
    monkeypatch.chdir(tmp_path)
    error = refused(hub.main, ["space", "--model", "runs/de-en", "--output_dir", "space"], capsys)
    assert "--model runs/de-en: no such folder (it is written as a path: runs is a folder here)" in error
    assert not (tmp_path / "space").exists()
    assert model_path_problem(model / "config.json") == (f"--model {model / 'config.json'} is a file; name the "
                                                         "model's folder (the one holding config.json)")


def test_commands_that_take_local_folders_only_refuse_any_other_name(capsys):
    for main, words in (MODEL_COMMANDS["evaluate"], MODEL_COMMANDS["hub card"], MODEL_COMMANDS["hub push"]):
        error = refused(main, ["--model", "someone-de-en", *words], capsys)
        assert "--model someone-de-en: no such folder (a saved model folder is needed here)" in error


def test_a_tokenizer_path_that_names_no_folder_is_refused(model, data, capsys):
    error = refused(translate_command.main, ["--model", model, "--tokenizer", "./tokenizer", "--input",
                                             data["test.src"]], capsys)
    assert "--tokenizer ./tokenizer: no such folder (it is written as a path" in error
