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
import shutil
import sys

import pytest

from hf_headattn import parallel_data, tokenization, translation
from hf_headattn.commands import app, average, demo, evaluate, export, hub, plot
from hf_headattn.commands import translate as translate_command
from hf_headattn.evaluation import evaluate_model
from hf_headattn.training import run as training_run
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
    lines = parallel_data.read_lines(data["test.src"])[:4]
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
    references = parallel_data.read_lines(data["test.tgt"])
    (tmp_path / "test.de").write_bytes(data["test.src"].read_bytes().replace(b"\n", b"\r"))
    (tmp_path / "test.en").write_bytes(with_line_ends(references, "\r\n", bom=True))
    evaluate.main(["--model", str(model), "--source", str(tmp_path / "test.de"), "--reference",
                   str(tmp_path / "test.en"), "--output_dir", str(tmp_path / "eval"), "--num_beams", "1",
                   "--device", "cpu", "--json"])
    results = json.loads(capsys.readouterr().out)
    assert results["test_set"]["sentences"] == N_TEST
    assert [example["reference"] for example in results["examples"]] == references[:3]

    (tmp_path / "latin1.en").write_bytes("\n".join(references[:-1] + ["Drei Männer"]).encode("latin-1"))
    with pytest.raises(ValueError, match=rf"latin1\.en, line {N_TEST}: not UTF-8 \(byte 0xe4 at character 7\)"):
        evaluate.main(["--model", str(model), "--source", str(data["test.src"]), "--reference",
                       str(tmp_path / "latin1.en"), "--output_dir", str(tmp_path / "eval2"), "--device", "cpu"])


def test_tokenizer_training_files_are_read_as_the_training_command_reads_them(data, tmp_path):
    lines = parallel_data.read_lines(data["train.src"])
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
