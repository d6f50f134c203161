"""Guided alignment in the training command: Pharaoh files checked against the corpus, eflomal's links cached, word
links mapped to subwords and batched, the flags checked before any data is read, and the guided heads read back by
`--alignments` (training/guided_links.py, translation/alignments.py)."""

import json

import pytest
import torch

from hf_headattn.tokenization import train_tokenizer
from hf_headattn.toy_corpus import make_toy_corpus
from hf_headattn.training import guided_links, run
from hf_headattn.training.guided_links import (GuidedAlignmentCollator, eflomal_links, links_matrix, read_pharaoh,
                                               subword_links)
from hf_headattn.training.run_folder import RunRefused
from hf_headattn.translation import alignments
from helpers import random_model, tiny_config, toy_data, train_tiny_model
from helpers.runs import refused_before_data

PAIRS = [("der hund läuft", "the dog runs"), ("ein ball", "a ball")]


def _pharaoh(tmp_path, text):
    path = tmp_path / "links.txt"
    path.write_text(text, encoding="utf-8")
    return path


# ------------------------------------------------------------------------------------------------ Pharaoh files
def test_a_pharaoh_file_is_read_and_possible_links_count_as_sure(tmp_path):
    path = _pharaoh(tmp_path, "0-0 1-1 2p2\n\n")
    assert read_pharaoh(path, PAIRS) == [[(0, 0), (1, 1), (2, 2)], []]


@pytest.mark.parametrize("text, message", [
    ("0-0\n", r"links\.txt: 1 lines for 2 training pairs; a Pharaoh file has one line of links per line"),
    ("0-0\n0-0\n1-1\n", r"3 lines for 2 training pairs"),
    ("0-0\n0:1\n", r"links\.txt line 2: '0:1' is not a link; write i-j"),
    ("0-0 -1-0\n0-0\n", r"line 1: '-1-0' is not a link"),
    ("0-0\n2-0\n", r"line 2: link '2-0' names source word 2, but the source sentence has 2 word\(s\) \(0\.\.1\): "
                   r"'ein ball'"),
    ("0-3\n0-0\n", r"line 1: link '0-3' names target word 3, but the target sentence has 3 word\(s\) \(0\.\.2\)"),
])
def test_a_bad_pharaoh_file_is_refused_naming_file_line_and_link(tmp_path, text, message):
    with pytest.raises(ValueError, match=message):
        read_pharaoh(_pharaoh(tmp_path, text), PAIRS)


def test_a_pharaoh_file_that_is_not_text_is_refused(tmp_path):
    path = tmp_path / "links.txt"
    path.write_bytes(b"0-0\n\xff\xfe\n")
    with pytest.raises(ValueError, match="not UTF-8 text"):
        read_pharaoh(path, PAIRS)


# ------------------------------------------------------------------------------------------------ subwords
@pytest.fixture(scope="module")
def tokenizer():
    pairs = make_toy_corpus(300, seed=3)
    return train_tokenizer(texts=[text for pair in pairs for text in pair], vocab_size=120, model="bpe")


def test_word_links_link_every_subword_of_one_word_to_every_subword_of_the_other(tokenizer):
    source, target = "der schmetterling läuft", "the butterfly runs"
    source_ids, target_ids = tokenizer(source)["input_ids"], tokenizer(target)["input_ids"]
    (flat,) = subword_links(tokenizer, [source], [target], [[(1, 1), (0, 0)]], max_length=64)
    pairs = set(zip(flat[0::2], flat[1::2]))
    source_words = guided_links._subword_words(source, tokenizer(source, return_offsets_mapping=True)["offset_mapping"])
    target_words = guided_links._subword_words(target, tokenizer(target, return_offsets_mapping=True)["offset_mapping"])
    expected = {(t, s) for t, tw in enumerate(target_words) for s, sw in enumerate(source_words)
                if (sw, tw) in {(1, 1), (0, 0)}}
    assert pairs == expected
    assert source_words.count(1) > 1 or target_words.count(1) > 1, "expected a word of several subwords"
    assert source_words[-1] is None and len(source_words) == len(source_ids)  # </s>: no word, no link
    assert len(target_words) == len(target_ids)


def test_words_cut_off_by_max_length_lose_their_links(tokenizer):
    (flat,) = subword_links(tokenizer, ["der hund läuft schnell"], ["the dog runs fast"], [[(0, 0), (3, 3)]],
                            max_length=3)
    assert all(position < 3 for position in flat) and flat


def test_the_links_matrix_is_a_distribution_per_linked_target_position():
    matrix = links_matrix([[0, 0, 0, 1, 2, 2], []], target_length=4, source_length=3)
    torch.testing.assert_close(matrix[0, 0], torch.tensor([0.5, 0.5, 0.0]))
    torch.testing.assert_close(matrix[0, 2], torch.tensor([0.0, 0.0, 1.0]))
    assert matrix[0, 1].sum() == 0 and matrix[0, 3].sum() == 0 and matrix[1].sum() == 0


def test_the_collator_pads_the_links_with_the_batch(tokenizer):
    from transformers import DataCollatorForSeq2Seq

    collator = GuidedAlignmentCollator(DataCollatorForSeq2Seq(tokenizer, label_pad_token_id=-100))
    features = [{"input_ids": [5, 6, 1], "labels": [7, 1], "alignment_links": [0, 1]},
                {"input_ids": [5, 1], "labels": [7, 8, 9, 1], "alignment_links": [2, 0, 2, 1]}]
    batch = collator(features)
    assert batch["alignment_links"].shape == (2, 4, 3)
    assert batch["alignment_links"][0, 0, 1] == 1 and batch["alignment_links"][1, 2, :2].tolist() == [0.5, 0.5]
    assert "alignment_links" not in collator([{"input_ids": [5, 1], "labels": [7, 1]}])  # validation batches


# ------------------------------------------------------------------------------------------------ eflomal
def test_eflomals_links_are_cached_by_the_corpus_and_read_back(tmp_path, monkeypatch):
    pairs = make_toy_corpus(40, seed=5)
    links, cached = eflomal_links(pairs, cache_folder=tmp_path)
    assert cached.is_file() and len(links) == len(pairs) and all(links)

    def must_not_align(*args, **kwargs):
        raise AssertionError("aligned again although the links of these pairs are cached")

    monkeypatch.setattr("hf_headattn.alignment.align_corpus", must_not_align)
    again, cached_again = eflomal_links(pairs, cache_folder=tmp_path)
    assert again == links and cached_again == cached
    with pytest.raises(AssertionError, match="aligned again"):  # other pairs: another fingerprint
        eflomal_links(pairs[:-1], cache_folder=tmp_path)


def test_a_damaged_links_cache_is_aligned_again(tmp_path):
    pairs = make_toy_corpus(40, seed=5)
    links, cached = eflomal_links(pairs, cache_folder=tmp_path)
    cached.write_text("0-0\n", encoding="utf-8")  # cut short
    again, _ = eflomal_links(pairs, cache_folder=tmp_path)
    assert len(again) == len(pairs) and read_pharaoh(cached, pairs) == again


# ------------------------------------------------------------------------------------------------ the command
@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return toy_data(tmp_path_factory.mktemp("data"))


def _first_word_links(data, tmp_path, broken_line=None, link="0-0"):
    lines = data["train.src"].read_text(encoding="utf-8").splitlines()
    text = [link] * len(lines)
    if broken_line is not None:
        text[broken_line - 1] = "0-0 99-0"
    return _pharaoh(tmp_path, "\n".join(text) + "\n")


FAIL_FAST = {
    "weight without links": (["--guided_alignment_weight", "0.1"],
                             "--guided_alignment_weight applies with --guided_alignment"),
    "heads without links": (["--guided_alignment_heads", "1"], "--guided_alignment_heads applies with"),
    "missing file": (["--guided_alignment", "/nowhere.links"], "--guided_alignment /nowhere.links: no such file"),
    "bad cost": (["--guided_alignment", "eflomal", "--guided_alignment_cost", "kl"],
                 "argument --guided_alignment_cost/--guided-alignment-cost: invalid choice: 'kl'"),
    "layer outside the decoder": (["--guided_alignment", "eflomal", "--guided_alignment_layer", "3"],
                                  "--guided_alignment_layer: `guided_alignment_layer`=3 is not a decoder layer"),
    "head outside the layer": (["--guided_alignment", "eflomal", "--guided_alignment_heads", "0,4"],
                               r"--guided_alignment_heads: `guided_alignment_heads`=[0, 4]"),
    "heads not numbers": (["--guided_alignment", "eflomal", "--guided_alignment_heads", "first"],
                          "--guided_alignment_heads 'first': give head indices separated by commas"),
    "negative weight": (["--guided_alignment", "eflomal", "--guided_alignment_weight", "-1"],
                        "--guided_alignment_weight: `guided_alignment_weight` must be a finite number >= 0"),
    "layer of an LSTM": (["--architecture", "rnn", "--guided_alignment", "eflomal", "--guided_alignment_layer", "0"],
                         "--guided_alignment_layer applies to --architecture transformer only"),
    "full context without links": (["--guided_alignment_full_context"],
                                   "--guided_alignment_full_context applies with --guided_alignment"),
    "full context of an LSTM": (["--architecture", "rnn", "--guided_alignment", "eflomal",
                                 "--guided_alignment_full_context"],
                                "--guided_alignment_full_context applies to --architecture transformer only"),
}


@pytest.mark.parametrize("case", sorted(FAIL_FAST))
def test_bad_guided_alignment_flags_fail_before_any_data_is_read(case, data, tmp_path, monkeypatch, capsys):
    flags, message = FAIL_FAST[case]
    error = refused_before_data(["--train_source", str(data["train.src"]), "--train_target", str(data["train.tgt"]),
                                 "--output_dir", str(tmp_path / "run"), "--layers", "3", *flags], monkeypatch, capsys)
    assert f"hf-headattn-train: error: {message}" in error, error


def test_a_pharaoh_file_with_a_bad_link_stops_the_run_before_the_tokenizer_is_trained(data, tmp_path, monkeypatch):
    links = _first_word_links(data, tmp_path, broken_line=7)

    def must_not_run(*args, **kwargs):
        raise AssertionError("trained a tokenizer before checking the links")

    monkeypatch.setattr(run, "train_corpus_tokenizer", must_not_run)
    with pytest.raises(RunRefused, match=r"links\.txt line 7: link '99-0' names source word 99, but the source "
                                         r"sentence has \d+ word"):
        train_tiny_model(data, tmp_path / "run", "transformer", "--guided_alignment", str(links))


def test_a_pharaoh_file_of_the_wrong_length_stops_the_run(data, tmp_path):
    links = _pharaoh(tmp_path, "0-0\n" * 5)
    with pytest.raises(RunRefused, match=r"links\.txt: 5 lines for 200 training pairs"):
        train_tiny_model(data, tmp_path / "run", "transformer", "--guided_alignment", str(links))


@pytest.mark.parametrize("family", ["transformer", "rnn"])
def test_a_guided_run_logs_the_cost_records_its_links_and_heads_and_translate_reads_them(family, data, tmp_path,
                                                                                          monkeypatch):
    from hf_headattn.training.trainer import HeadAttnSeq2SeqTrainer

    logged = []
    own_log = HeadAttnSeq2SeqTrainer.log
    monkeypatch.setattr(HeadAttnSeq2SeqTrainer, "log", lambda self, logs, *args: (own_log(self, logs, *args),
                                                                                   logged.append(logs))[0])
    links = _first_word_links(data, tmp_path)
    extra = ["--guided_alignment", str(links), "--guided_alignment_heads", "1", "--guided_alignment_weight", "0.3"]
    if family == "transformer":
        extra += ["--guided_alignment_layer", "0", "--guided_alignment_full_context"]
    folder = train_tiny_model(data, tmp_path / "run", family, *extra)
    config = json.loads((folder / "config.json").read_text())
    assert config["guided_alignment_weight"] == 0.3 and config["guided_alignment_heads"] == [1]
    assert config.get("guided_alignment_full_context", False) == (family == "transformer")
    manifest = json.loads((folder / "run_manifest.json").read_text())
    assert manifest["guided_alignment"]["links"] == str(links.resolve())
    assert manifest["guided_alignment"]["pairs_with_links"] == 200  # every pair of the toy files: 0-0
    training_logs = [entry for entry in logged if "loss" in entry]
    assert len(training_logs) == 3 and all(entry["alignment_loss"] > 0 for entry in training_logs)
    from hf_headattn.loading import load_model_and_tokenizer

    model, _ = load_model_and_tokenizer(folder)
    assert alignments.guided_heads(model) == (0, [1])


def test_the_guided_heads_are_what_alignments_read_by_default():
    model = random_model(tiny_config(guided_alignment_weight=0.1, guided_alignment_layer=0,
                                     guided_alignment_heads=[2], pruned_heads={"decoder.layers.0.encoder_attn": [0]}))
    assert alignments.alignment_layer_index(model, None) == 0
    assert alignments.guided_heads(model) == (0, [1])  # head 2 is the second the pruned layer keeps
    attention = torch.rand(1, 3, 2, 4)
    outputs = type("Outputs", (), {"cross_attentions": (attention, torch.rand(1, 4, 2, 4))})()
    torch.testing.assert_close(alignments.reduced_attention(model, outputs, None, "mean"), attention[:, 1])
    torch.testing.assert_close(alignments.reduced_attention(model, outputs, None, "all"), attention.mean(1))
    torch.testing.assert_close(alignments.reduced_attention(model, outputs, 1, "mean"), outputs.cross_attentions[1].mean(1))
    unguided = random_model(tiny_config())
    assert alignments.alignment_layer_index(unguided, None) == 1 and alignments.guided_heads(unguided) is None
