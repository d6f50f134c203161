"""The training command: argument parsing and fail-fast checks, data loading, Hugging Face datasets, the demo,
and (slow) real-data and two-process runs."""

import gc
import json
import logging
import os
import pickle
import shutil
import subprocess
import sys
import warnings

import datasets
import pyarrow
import pytest
from datasets import Dataset, Features, List, Value

from hf_headattn import HeadAttnForConditionalGeneration, demo
from hf_headattn.tokenization import train_tokenizer
from hf_headattn.toy_corpus import make_toy_corpus, write_toy_corpus
from hf_headattn.evaluation import translate_and_score
from hf_headattn.runtime.attention_registry import ATTENTION_VARIANTS
from hf_headattn.parallel_data import PairFiles, pairs_on_disk, read_pairs, read_parallel_files
from hf_headattn.training import arguments, checkpoints, data, run
from hf_headattn.training.arguments import parse_args
from hf_headattn.training.data import PairChunkReader, load_hub_translation_dataset, tokenize_parallel
from hf_headattn.training.run import train
from hf_headattn.training.trainer import HeadAttnSeq2SeqTrainer
from hf_headattn.translation import translate_sentences

from helpers import MULTI30K, file_flags, tiny_config
from helpers.runs import refused_before_data


TINY_MODEL = ["--vocab_size", "300", "--d_model", "32", "--layers", "1", "--heads", "2", "--ffn_dim", "64",
              "--per_device_train_batch_size", "16", "--warmup_steps", "5", "--max_length", "32"]


@pytest.fixture(scope="module")
def toy_files(tmp_path_factory):
    return write_toy_corpus(tmp_path_factory.mktemp("data"), n_train=60, n_valid=5, seed=0)


def test_missing_and_misaligned_files_raise_clear_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"Text file not found: .*nowhere\.de"):
        read_parallel_files(tmp_path / "nowhere.de", tmp_path / "nowhere.en")
    (tmp_path / "a.de").write_text("eins\nzwei\n")
    (tmp_path / "a.en").write_text("one\n")
    with pytest.raises(ValueError, match=r"a\.de has 2 lines but .*a\.en has 1; parallel files must be line-aligned"):
        read_parallel_files(tmp_path / "a.de", tmp_path / "a.en")


def test_unicode_line_separators_stay_inside_lines_and_empty_pairs_are_skipped_and_counted(tmp_path, caplog):
    # str.splitlines() would also split at U+2028, U+0085, form feed and \x1c-\x1e, shifting every later pair
    sources = ["ein\u2028hund", "zwei\x0ckatzen", "", "drei\x1cvögel\x85", "vier\r", "fünf"]
    targets = ["a\u2029dog", "two cats", "empty source", "three\x1ebirds", "four", "  "]
    (tmp_path / "a.de").write_bytes("\n".join(sources).encode())  # no final newline; "vier\r\n" is a CRLF line
    (tmp_path / "a.en").write_bytes(("\r\n".join(targets) + "\r\n").encode())
    assert list(read_parallel_files(tmp_path / "a.de", tmp_path / "a.en")["source"]) == [
        "ein\u2028hund", "zwei\x0ckatzen", "", "drei\x1cvögel\x85", "vier", "fünf"]
    with caplog.at_level(logging.WARNING, logger="hf_headattn.training"):
        kept = read_parallel_files(tmp_path / "a.de", tmp_path / "a.en", skip_empty=True)
    assert list(zip(kept["source"], kept["target"])) == [
        ("ein\u2028hund", "a\u2029dog"), ("zwei\x0ckatzen", "two cats"), ("drei\x1cvögel\x85", "three\x1ebirds"),
        ("vier", "four")]
    assert "skipped 2 pairs with an empty line, kept 4" in caplog.text


def test_tokenisation_pool_forks_from_a_heap_frozen_out_of_the_garbage_collector(monkeypatch):
    """The pool's workers are forked while every object is frozen (gc.freeze), so that the collector does not copy
    the command's heap into each of them; afterwards the heap is collected as before. Without a pool nothing is
    frozen (the freeze's collection would only cost time)."""
    import gc

    frozen_during_map = []
    real_map = Dataset.map

    def recording_map(self, *args, **kwargs):
        frozen_during_map.append(gc.get_freeze_count())
        return real_map(self, *args, **kwargs)

    monkeypatch.setattr(Dataset, "map", recording_map)
    pairs = make_toy_corpus(20, seed=0)
    tokenizer = train_tokenizer(texts=[text for pair in pairs for text in pair], vocab_size=150)
    before = gc.get_freeze_count()
    dataset = tokenize_parallel(Dataset.from_dict({"source": [s for s, _ in pairs], "target": [t for _, t in pairs]}),
                                tokenizer, num_proc=2)
    assert len(dataset) == 20 and frozen_during_map[0] > before + 1000
    assert gc.get_freeze_count() == before
    tokenize_parallel(Dataset.from_dict({"source": [s for s, _ in pairs], "target": [t for _, t in pairs]}),
                      tokenizer)  # 20 pairs: one process
    assert frozen_during_map[1] == before


def test_training_pairs_are_tokenised_from_their_files_in_chunks_as_their_dataset_is(tmp_path, monkeypatch):
    """`PairsOnDisk` (the training command's pairs from files: blank pairs skipped, the first --max_train_pairs,
    the held-out tail split off) tokenised in chunks read from the files give the rows of tokenising the Dataset
    that `read_pairs` builds of the same pairs, over two processes and chunks that cut them unevenly; the text is
    never copied into an Arrow file of the datasets cache."""
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "cache")
    monkeypatch.setattr(data, "TOKENISED_CHUNK_PAIRS", 4)
    pairs = make_toy_corpus(57, seed=1)
    sources, targets = [s for s, _ in pairs], [t for _, t in pairs]
    sources[3], targets[10] = "", "  "
    (tmp_path / "train.tsv").write_text("".join(f"{s}\t{t}\n" for s, t in zip(sources, targets)))
    files = PairFiles(file=tmp_path / "train.tsv")
    tokenizer = train_tokenizer(texts=sources + targets, vocab_size=150)

    on_disk = pairs_on_disk(files, max_pairs=50, skip_empty=True)
    assert (on_disk.read, on_disk.skipped_empty, len(on_disk.dataset)) == (57, 2, 50)
    kept, held_out = on_disk.dataset.split(40)
    in_arrow = read_pairs(files, max_pairs=50, skip_empty=True).dataset
    assert held_out.columns() == (list(in_arrow["source"])[40:], list(in_arrow["target"])[40:])
    arrow_files = set((tmp_path / "cache").rglob("*.arrow"))
    for part, rows in ((kept, range(40)), (held_out, range(40, 50))):
        chunked = tokenize_parallel(part, tokenizer, num_proc=2)
        assert chunked.to_dict() == tokenize_parallel(in_arrow.select(rows), tokenizer).to_dict()
        assert chunked.features == Features({"input_ids": List(Value("int32")), "labels": List(Value("int32"))})
    made = set((tmp_path / "cache").rglob("*.arrow")) - arrow_files  # the chunks and the tokenised pairs
    assert len(made) >= 4
    for path in made:
        assert "source" not in pyarrow.ipc.open_stream(pyarrow.OSFile(str(path))).schema.names, path

    reader = PairChunkReader(kept)  # consecutive chunks read on; one elsewhere starts over
    read = ([], [])
    for first, count in ((8, 4), (12, 2), (0, 3)):
        reader.read(first, count, *read)
    every_source, every_target = kept.columns()
    assert read == (every_source[8:14] + every_source[:3], every_target[8:14] + every_target[:3])
    assert pickle.loads(pickle.dumps(reader))._next is None  # a process's copy starts with nothing read


def test_fertility_reads_no_text_for_a_model_without_fertility_bounds():
    class Unread:
        def columns(self):
            raise AssertionError("the training text was read")

        __getitem__ = columns

    run.prepare_fertility(HeadAttnForConditionalGeneration(tiny_config()), tokenizer=None, train_text=Unread())


def test_pairs_longer_than_max_length_are_truncated_and_counted(caplog):
    pairs = make_toy_corpus(40, seed=0)
    tokenizer = train_tokenizer(texts=[text for pair in pairs for text in pair], vocab_size=150)
    long_source, long_target = " ".join(s for s, _ in pairs[:6]), " ".join(t for _, t in pairs[:6])
    sources = [s for s, _ in pairs] + [long_source, pairs[0][0]]
    targets = [t for _, t in pairs] + [pairs[0][1], long_target]
    max_length = 24
    assert all(len(tokenizer(text).input_ids) <= max_length for pair in pairs for text in pair)

    with caplog.at_level(logging.WARNING, logger="hf_headattn.training"):
        dataset = tokenize_parallel(Dataset.from_dict({"source": sources, "target": targets}), tokenizer, max_length,
                                    split="validation")
    assert ("2 of 42 validation pairs are longer than --max_length 24 tokens on one side and are truncated"
            in caplog.text)
    # the ids as 32-bit integers, no attention mask (all ones until the collator pads a batch and writes it)
    assert dataset.features == Features({"input_ids": List(Value("int32")), "labels": List(Value("int32"))})
    assert len(dataset[40]["input_ids"]) == len(dataset[41]["labels"]) == max_length
    direct = tokenizer(sources, text_target=targets, max_length=max_length, truncation=True)
    assert dataset.to_dict() == {key: direct[key] for key in dataset.column_names}

    caplog.clear()
    stream = Dataset.from_dict({"source": sources, "target": targets}).to_iterable_dataset()
    with caplog.at_level(logging.WARNING, logger="hf_headattn.training"):
        rows = list(tokenize_parallel(stream, tokenizer, max_length))
    assert len(rows) == 42 and set(rows[0]) == {"input_ids", "labels"}
    assert caplog.text.count("a training pair is longer than --max_length 24 tokens and is truncated") == 1

    caplog.clear()
    tokenizer.model_max_length = max_length
    with caplog.at_level(logging.WARNING, logger="hf_headattn.translation"):
        translate_sentences(HeadAttnForConditionalGeneration(tiny_config(vocab_size=len(tokenizer))), tokenizer,
                            [long_source, pairs[0][0]], num_beams=1, max_new_tokens=2)
    assert "1 line(s) longer than the model's 24 tokens are translated cut to 24: line 1" in caplog.text


def test_flags_parse_under_underscore_and_dash_names_and_from_json_or_yaml_files(toy_files, tmp_path, capsys):
    underscore = parse_args([*file_flags(toy_files), "--output_dir", str(tmp_path / "a"), "--cross_attention", "dhicm",
                             "--max_tokens", "512", "--bf16", "--save_steps", "7"])
    dash = parse_args(["--train-source", str(toy_files["train.src"]), "--train-target", str(toy_files["train.tgt"]),
                       "--output-dir", str(tmp_path / "a"), "--cross-attention", "dhicm", "--max-tokens", "512",
                       "--bf16", "--save-steps", "7"])
    for parsed in (underscore, dash):
        model_args, data_args, run_args, training_args = parsed
        assert model_args.cross_attention == "dhicm" and data_args.max_tokens == 512
        assert training_args.bf16 and training_args.save_steps == 7
        # the NMT defaults, where Trainer's are for fine-tuning
        assert training_args.per_device_train_batch_size == 64 and training_args.save_total_limit == 2
        assert training_args.lr_scheduler_type == "inverse_sqrt" and training_args.eval_strategy == "steps"
        assert training_args.resume_from_checkpoint is None

    values = {"train_source": str(toy_files["train.src"]), "train_target": str(toy_files["train.tgt"]),
              "output_dir": str(tmp_path / "b"), "architecture": "rnn", "hops": 2, "max_steps": 9}
    (tmp_path / "args.json").write_text(json.dumps(values))
    (tmp_path / "args.yaml").write_text("".join(f"{key}: {value}\n" for key, value in values.items()))
    for name in ("args.json", "args.yaml"):
        model_args, _, _, training_args = parse_args([str(tmp_path / name)])
        assert (model_args.architecture, model_args.hops, training_args.max_steps) == ("rnn", 2, 9)
        assert training_args.per_device_train_batch_size == 64
    # argparse checks choices on the command line; an arguments file gets the same check
    (tmp_path / "bad.yaml").write_text(
        f"train_source: {toy_files['train.src']}\ntrain_target: {toy_files['train.tgt']}\nfertility: sometimes\n")
    with pytest.raises(SystemExit):
        parse_args([str(tmp_path / "bad.yaml")])
    assert "error: --fertility 'sometimes': choose from constant, guided, predicted" in capsys.readouterr().err


@pytest.mark.parametrize("line, message", [
    ("per_device_train_batch_size: sixteen", "per_device_train_batch_size: 'sixteen' is text, but "
                                             "--per_device_train_batch_size takes a whole number"),
    ("learning_rate: 5e-4", "learning_rate: '5e-4' is text, but --learning_rate takes a number (YAML reads 5e-4 as "
                            "text: write it with a dot before the exponent, e.g. 5.0e-4)"),
    ("max_steps: 2.5", "max_steps: 2.5 is a decimal number, but --max_steps takes a whole number"),
    ("disable_tqdm: 'yes'", "disable_tqdm: 'yes' is text, but --disable_tqdm takes true or false or null"),
    ("cross_attention: 5", "cross_attention: 5 is a whole number, but --cross_attention takes text"),  # AttributeError
    ("report_to: [1]", "report_to: [1] is a list, but --report_to takes null or text or a list of text"),
], ids=["text-count", "yaml-exponent", "fraction-count", "text-bool", "number-text", "list-of-numbers"])
def test_an_arguments_file_value_of_another_type_is_refused_naming_flag_value_and_type(line, message, toy_files,
                                                                                       tmp_path, capsys):
    arguments = tmp_path / "args.yaml"  # parse_dict passed these on unconverted, to fail in Trainer or not at all
    arguments.write_text(f"train_source: {toy_files['train.src']}\ntrain_target: {toy_files['train.tgt']}\n"
                         f"output_dir: {tmp_path / 'run'}\n{line}\n")
    with pytest.raises(SystemExit) as refused:
        parse_args([str(arguments)])
    assert refused.value.code == 2
    assert f"hf-headattn-train: error: {arguments}: {message}" in capsys.readouterr().err


def test_the_anchor_preset_sets_the_recipe_and_given_flags_win(toy_files, tmp_path, capsys):
    model_args, data_args, run_args, training_args = parse_args(
        [*file_flags(toy_files), "--output_dir", str(tmp_path / "a"), "--preset", "multi30k-anchor", "--seed", "3"])
    assert run_args.preset == "multi30k-anchor" and training_args.seed == 3
    # the anchor: shape d_model 256, 3 + 3 layers, 4 heads, FFN 1024, joint BPE of 8,000, ~2,000 target tokens a batch
    assert (model_args.d_model, model_args.layers, model_args.heads, model_args.ffn_dim) == (256, None, None, 1024)
    assert (model_args.vocab_size, model_args.tokenizer_model, model_args.dropout, model_args.label_smoothing) == (
        8000, "bpe", 0.1, 0.1)
    assert data_args.max_tokens == 4500 and training_args.max_steps == 2090
    assert (training_args.learning_rate, training_args.lr_scheduler_type, training_args.warmup_steps) == (
        5e-4, "inverse_sqrt", 1000)
    assert (training_args.adam_beta1, training_args.adam_beta2, training_args.adam_epsilon) == (0.9, 0.98, 1e-9)
    assert (training_args.weight_decay, training_args.max_grad_norm) == (0.0, 1.0)

    # flags beside the preset win, in either order; an arguments file can name the preset too
    _, data_args, _, training_args = parse_args([*file_flags(toy_files), "--max_steps", "7", "--output_dir",
                                                 str(tmp_path / "b"), "--preset", "multi30k-anchor", "--max_tokens", "600"])
    assert (training_args.max_steps, data_args.max_tokens, training_args.warmup_steps) == (7, 600, 1000)
    (tmp_path / "args.yaml").write_text(f"train_source: {toy_files['train.src']}\ntrain_target: "
                                        f"{toy_files['train.tgt']}\noutput_dir: {tmp_path / 'c'}\npreset: "
                                        "multi30k-anchor\nwarmup_steps: 10\n")
    _, data_args, _, training_args = parse_args([str(tmp_path / "args.yaml")])
    assert (data_args.max_tokens, training_args.adam_beta2, training_args.warmup_steps) == (4500, 0.98, 10)

    with pytest.raises(SystemExit):
        parse_args([*file_flags(toy_files), "--output_dir", str(tmp_path / "d"), "--preset", "wmt-big"])
    assert "--preset" in capsys.readouterr().err


def test_the_anchor_batches_hold_about_2000_target_tokens():
    """On Multi30k De-En with the preset's tokenizer, --max_tokens 4500 (source + target, padding included) gives
    batches of ~2,000 real target tokens, the anchor's, and 2,090 steps are ~10 epochs."""
    if not MULTI30K.is_dir():
        pytest.skip(f"Multi30k not found at {MULTI30K}")
    import numpy as np

    from hf_headattn.training.batching import TokenBudgetBatchSampler

    sources = (MULTI30K / "train.de").read_text(encoding="utf-8").splitlines()
    targets = (MULTI30K / "train.en").read_text(encoding="utf-8").splitlines()
    tokenizer = train_tokenizer(texts=iter(sources + targets), vocab_size=8000)
    source_lengths = np.array([len(ids) for ids in tokenizer(sources)["input_ids"]])
    target_lengths = np.array([len(ids) for ids in tokenizer(text_target=targets)["input_ids"]])
    batches = len(TokenBudgetBatchSampler(source_lengths, target_lengths, max_tokens=4500))
    target_tokens_per_batch = target_lengths.sum() / batches
    print(f"{batches} batches an epoch, {target_tokens_per_batch:.0f} real target tokens a batch")
    assert 1900 <= target_tokens_per_batch <= 2200


FAIL_FAST = {  # flags -> the error, which names the flag
    "rnn with a Transformer site": (["--architecture", "rnn", "--cross_attention", "dhicm"],
                                    "--cross_attention applies to --architecture transformer only"),
    "hops with the Transformer": (["--hops", "3"], "--hops applies to --architecture rnn only"),
    "fertility without constrained attention": (["--fertility", "guided"],
                                                "--fertility applies to constrained attention only"),
    "fertility with an LSTM softmax": (["--architecture", "rnn", "--fertility", "predicted"],
                                       "--fertility applies to constrained attention only"),
    "predictor epochs without predicted fertility": (
        ["--cross_attention", "csparsemax", "--fertility", "guided", "--fertility_predictor_epochs", "2"],
        "--fertility_predictor_epochs applies to --fertility predicted only"),
    "bad JSON": (["--cross_attention", '{"type": "dhicm",'],
                 "--cross_attention '{\"type\": \"dhicm\",' is not valid JSON"),
    "unknown variant": (["--encoder_self_attention", "fancy"],
                        "--encoder_self_attention: Unknown attention variant 'fancy'"),
    "variant at the wrong site": (["--decoder_self_attention", "multihop"],
                                  "--decoder_self_attention: Attention variant 'multihop' cannot be used"),
    "heads that do not divide d_model": (["--heads", "3"],
                                         "--heads: `encoder_attention_heads`=3 does not divide d_model=256"),
    "odd LSTM size": (["--architecture", "rnn", "--hidden_size", "33"], "--hidden_size: `hidden_size` must be even"),
    "bad choice": (["--fertility", "sometimes"], "argument --fertility: invalid choice: 'sometimes'"),
    "zero epochs": (["--num_train_epochs", "0"], "--num_train_epochs must be positive, got 0.0"),
    "zero steps": (["--max_steps", "0"], "--max_steps must be positive (or -1: train for --num_train_epochs)"),
    "missing tokenizer": (["--tokenizer", "/nonexistent"], "--tokenizer /nonexistent: no such folder"),
    "missing text file": (["--valid_source", "/nowhere.de", "--valid_target", "/nowhere.en"],
                          "--valid_source /nowhere.de: no such file"),
    "budget below a pair": (["--max_tokens", "100"], "--max_tokens 100 cannot hold a pair of --max_length 128"),
    "pools without a budget": (["--bucket_pool_pairs", "500"], "--bucket_pool_pairs 500 pools the token-budget "
                                                               "batches of --max_tokens; give --max_tokens too"),
    "empty pools": (["--max_tokens", "4000", "--bucket_pool_pairs", "0"], "--bucket_pool_pairs must be positive"),
    "Trainer's label smoothing": (["--label_smoothing_factor", "0.1"], "--label_smoothing_factor makes Trainer"),
    "Trainer's upload": (["--push_to_hub"], "--push_to_hub: Trainer's upload copies each checkpoint's model"),
    "early stopping alone": (["--early_stopping_patience", "2"], "--early_stopping_patience needs"),
    # Trainer's counts and numbers, refused by Trainer only deep inside or never (issue 44)
    "no accumulation": (["--gradient_accumulation_steps", "0"],  # a ZeroDivisionError once training started
                        "--gradient_accumulation_steps must be a whole number >= 1 (batches summed"),
    "empty batches": (["--per_device_train_batch_size", "0"], "--per_device_train_batch_size must be a whole number"),
    "empty validation batches": (["--per_device_eval_batch_size", "0"],
                                 "--per_device_eval_batch_size must be a whole number >= 1"),
    "no generation beams": (["--generation_num_beams", "0"], "--generation_num_beams must be a whole number >= 1"),
    "no checkpoints kept": (["--save_total_limit", "0"], "--save_total_limit must be a whole number >= 1 "
                                                         "(checkpoints kept; omit it to keep every one), got 0"),
    "checkpoints every 0 steps": (["--save_steps", "0"], "--save_steps must be > 0"),
    "negative workers": (["--dataloader_num_workers", "-1"], "--dataloader_num_workers must be a whole number >= 0"),
    "negative seed": (["--seed", "-1"], "--seed must be a whole number in [0, 4294967295]"),
    "nan learning rate": (["--learning_rate", "nan"], "--learning_rate is nan; give a number"),
    "negative learning rate": (["--learning_rate", "-1"], "--learning_rate must be a finite number >= 0, got -1.0"),
}


@pytest.mark.parametrize("case", sorted(FAIL_FAST))
def test_bad_flags_fail_before_any_data_is_read(case, toy_files, tmp_path, monkeypatch, capsys):
    flags, message = FAIL_FAST[case]
    error = refused_before_data(["--train_source", str(toy_files["train.src"]), "--train_target",
                                 str(toy_files["train.tgt"]), "--output_dir", str(tmp_path), *flags], monkeypatch, capsys)
    assert f"hf-headattn-train: error: {message}" in error, error


def test_ambiguous_data_arguments_and_a_finished_output_dir_are_refused(toy_files, tmp_path, capsys):
    with pytest.raises(SystemExit):
        train(["--output_dir", str(tmp_path)])
    assert ("give the training data once: --train_source/--train_target (two text files), --train_file (one TSV or "
            "JSON lines file) or --dataset") in capsys.readouterr().err
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(SystemExit):
        train([*file_flags(toy_files), "--output_dir", str(tmp_path)])
    assert "already holds a trained model and no checkpoint to resume from; add --overwrite_output_dir" in (
        capsys.readouterr().err)
    assert parse_args([*file_flags(toy_files), "--output_dir", str(tmp_path), "--overwrite_output_dir"])


def test_resume_picks_the_last_complete_checkpoint_of_the_same_model(toy_files, tmp_path):
    import torch

    model_args, data_args, _, _ = parse_args([*file_flags(toy_files), "--output_dir", str(tmp_path), *TINY_MODEL])
    tokenizer = train_tokenizer(texts=["ein hund läuft .", "a dog runs ."], vocab_size=64)
    for step in (3, 6, 9):  # checkpoints whose files are whole (the resume checks them), if not what Trainer saves
        run.build_model(arguments.build_config(model_args, data_args)).save_pretrained(tmp_path / f"checkpoint-{step}")
        tokenizer.save_pretrained(tmp_path / f"checkpoint-{step}")
        for name in ("optimizer.pt", "scheduler.pt"):
            torch.save({}, tmp_path / f"checkpoint-{step}" / name)
        if step < 9:  # checkpoint-9 was being written when the run was killed: no trainer_state.json yet
            (tmp_path / f"checkpoint-{step}" / "trainer_state.json").write_text("{}")
    assert checkpoints.last_complete_checkpoint(tmp_path) == str(tmp_path / "checkpoint-6")
    _, _, run_args, training_args = parse_args([*file_flags(toy_files), "--output_dir", str(tmp_path), *TINY_MODEL])
    assert checkpoints.find_checkpoint(run_args, training_args) == str(tmp_path / "checkpoint-6")

    checkpoints.check_checkpoint_config(arguments.build_config(model_args, data_args), str(tmp_path / "checkpoint-6"))
    model_args.d_model = 64
    with pytest.raises(ValueError, match=r"checkpoint-6 holds a different model than these flags describe "
                                         r"\(d_model: 32 there, 64 now\)"):
        checkpoints.check_checkpoint_config(arguments.build_config(model_args, data_args),
                                            str(tmp_path / "checkpoint-6"))


def test_help_lists_the_package_flags_first_with_defaults_and_variant_names():
    done = subprocess.run([sys.executable, "-m", "hf_headattn.commands.train", "--help"], capture_output=True,
                          text=True, env={**os.environ, "HF_HUB_OFFLINE": "1"}, timeout=300)
    assert done.returncode == 0, done.stderr
    text = " ".join(done.stdout.split())
    groups = [text.index(title) for title in (" model:", " data:", " run:", " Trainer (", " examples:")]
    assert groups == sorted(groups)
    assert f"variants: {', '.join(sorted(ATTENTION_VARIANTS))}" in text
    assert "(default: 8000)" in text and "The batch size per device for training. (default: 64)" in text
    assert "--max_tokens MAX_TOKENS" in text and "--max-tokens" not in text  # the dashed alias works, unshown


@pytest.mark.parametrize("eval_steps", [3, 500])
def test_validation_is_evaluated_once_at_the_end(eval_steps, toy_files, tmp_path, monkeypatch):
    """The final metrics reuse an evaluation training ran at its last step (eval_steps 3 of 3) instead of
    evaluating again, and evaluate once where training did not (eval_steps 500)."""
    calls = []
    evaluate = HeadAttnSeq2SeqTrainer.evaluate

    def counted(self, *args, **kwargs):
        calls.append(self.state.global_step)
        return evaluate(self, *args, **kwargs)

    monkeypatch.setattr(HeadAttnSeq2SeqTrainer, "evaluate", counted)
    metrics = train([*file_flags(toy_files), "--output_dir", str(tmp_path), "--max_steps", "3",
                     "--eval_steps", str(eval_steps), *TINY_MODEL])
    assert calls == [3] and metrics["eval_loss"] > 0


def test_training_runs_with_the_long_lived_objects_frozen_and_unfreezes_them(toy_files, tmp_path, monkeypatch):
    """Trainer's gc.collect() calls skip the modules, model and data (`run.long_lived_objects_frozen`); the caller's
    heap is collected as before once the run returns, also where it fails."""
    frozen = []
    save = HeadAttnSeq2SeqTrainer.save_model

    def recorded(self, *args, **kwargs):
        frozen.append(gc.get_freeze_count())
        return save(self, *args, **kwargs)

    monkeypatch.setattr(HeadAttnSeq2SeqTrainer, "save_model", recorded)
    train([*file_flags(toy_files), "--output_dir", str(tmp_path / "run"), "--max_steps", "2", *TINY_MODEL])
    assert frozen and min(frozen) > 100_000  # torch's and Transformers' modules among them
    assert gc.get_freeze_count() == 0

    def failing(self, *args, **kwargs):
        raise OSError("the disk is gone")

    monkeypatch.setattr(HeadAttnSeq2SeqTrainer, "save_model", failing)
    with pytest.raises(OSError, match="the disk is gone"):
        train([*file_flags(toy_files), "--output_dir", str(tmp_path / "failed"), "--max_steps", "1", *TINY_MODEL])
    assert gc.get_freeze_count() == 0


def test_early_stopping_ends_training_when_the_validation_loss_stops_improving(toy_files, tmp_path):
    # learning rate 0: the second evaluation is no better than the first, and patience 1 stops there
    train([*file_flags(toy_files), "--output_dir", str(tmp_path), "--max_steps", "10", "--learning_rate", "0",
           "--eval_steps", "1", "--save_steps", "1", "--load_best_model_at_end", "--early_stopping_patience", "1",
           "--keep_checkpoints", *TINY_MODEL])
    assert checkpoints.last_complete_checkpoint(tmp_path) == str(tmp_path / "checkpoint-2")


@pytest.mark.parametrize("flags", [
    ["--max_tokens", "200", "--cross_attention", "dhicm"],
    # BLEU/chrF at evaluation (sacrebleu), and eflomal alignments of the training pairs (it cannot be seeded)
    ["--cross_attention", "csparsemax", "--fertility", "guided", "--predict_with_generate",
     "--generation_num_beams", "1"],
], ids=["dhicm-max_tokens", "csparsemax-guided-bleu"])
def test_training_emits_no_python_warnings(flags, toy_files, tmp_path):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("default")
        train([*file_flags(toy_files), "--output_dir", str(tmp_path), "--max_steps", "2", *flags, *TINY_MODEL])
    assert not [f"{warning.category.__name__}: {warning.message}" for warning in caught]


def test_local_hf_dataset_with_translation_column(tmp_path):
    pairs = make_toy_corpus(120, seed=3)
    rows = [{"de": source, "en": target} for source, target in pairs]
    # a folder of data files, which load_dataset reads like a Hub dataset
    Dataset.from_dict({"translation": rows}).to_json(tmp_path / "dataset" / "train.jsonl")
    Dataset.from_dict({"translation": rows[:10]}).to_json(tmp_path / "dataset" / "validation.jsonl")
    loaded = load_hub_translation_dataset(str(tmp_path / "dataset"), None, "de", "en", "train")
    assert loaded[0] == {"source": pairs[0][0], "target": pairs[0][1]}
    with pytest.raises(ValueError, match=r"has languages \['de', 'en'\]; asked for 'fr' -> 'en'"):
        load_hub_translation_dataset(str(tmp_path / "dataset"), None, "fr", "en", "train")

    metrics = train(["--dataset", str(tmp_path / "dataset"), "--output_dir", str(tmp_path / "run"),
                     "--max_steps", "3", "--predict_with_generate", "--generation_num_beams", "1", *TINY_MODEL])
    assert metrics["train_pairs"] == 120 and "eval_bleu" in metrics and "eval_chrf" in metrics
    assert (tmp_path / "run" / "model.safetensors").exists()


def test_a_streamed_dataset_trains_with_a_given_tokenizer(tmp_path, capsys):
    pairs = make_toy_corpus(120, seed=3)
    rows = [{"de": source, "en": target} for source, target in pairs]
    Dataset.from_dict({"translation": rows}).to_json(tmp_path / "dataset" / "train.jsonl")
    Dataset.from_dict({"translation": rows[:10]}).to_json(tmp_path / "dataset" / "validation.jsonl")
    train_tokenizer(texts=[text for pair in pairs for text in pair], vocab_size=300, save_directory=tmp_path / "tok")
    streamed = ["--dataset", str(tmp_path / "dataset"), "--streaming", "--output_dir", str(tmp_path / "run"),
                *TINY_MODEL]
    with pytest.raises(SystemExit):
        train([*streamed, "--max_steps", "3"])
    assert "--streaming needs --dataset, --max_steps, --tokenizer" in capsys.readouterr().err
    metrics = train([*streamed, "--max_steps", "3", "--tokenizer", str(tmp_path / "tok")])
    assert metrics["train_pairs"] is None and metrics["eval_loss"] > 0
    assert (tmp_path / "run" / "model.safetensors").exists()


def test_demo_trains_reloads_through_remote_code_and_translates(tmp_path):
    summary = demo.run(tmp_path, epochs=5)
    assert summary["test_sentences"] == 100
    assert summary["bleu"] > 90, summary  # the toy language is learnt almost perfectly in 5 epochs
    assert (tmp_path / "model" / "pipeline_headattn.py").exists()
    scores = translate_and_score(tmp_path / "model", tmp_path / "data" / "test.src", tmp_path / "data" / "test.tgt",
                                 num_beams=4)
    assert scores["sentences"] == 100 and scores["bleu"] > 90
    # model, tokenizer and code once, no checkpoints left behind
    assert not list((tmp_path / "model").glob("checkpoint-*")) and not (tmp_path / "model" / "tokenizer").exists()


@pytest.mark.slow
@pytest.mark.skipif(not MULTI30K.is_dir(), reason=f"Multi30k not found at {MULTI30K}")
def test_train_on_2000_multi30k_pairs_end_to_end(tmp_path):
    metrics = train([
        "--train_source", str(MULTI30K / "train.de"), "--train_target", str(MULTI30K / "train.en"),
        "--valid_source", str(MULTI30K / "val.de"), "--valid_target", str(MULTI30K / "val.en"),
        "--max_train_pairs", "2000", "--max_valid_pairs", "100", "--output_dir", str(tmp_path),
        "--vocab_size", "2000", "--d_model", "64", "--layers", "2", "--heads", "4", "--ffn_dim", "128",
        "--num_train_epochs", "2", "--per_device_train_batch_size", "32", "--warmup_steps", "50",
        "--predict_with_generate", "--generation_num_beams", "2",
        "--cross_attention", '{"type": "running_sum", "layers": [-1]}',
    ])
    assert metrics["train_pairs"] == 2000 and metrics["eval_bleu"] >= 0 and metrics["eval_chrf"] > 0
    results = json.loads((tmp_path / "train_results.json").read_text())
    assert results["eval_bleu"] == metrics["eval_bleu"]
    from transformers import pipeline

    translator = pipeline("translation", model=str(tmp_path), trust_remote_code=True)
    assert isinstance(translator("Ein Hund läuft.")[0]["translation_text"], str)


@pytest.mark.slow
def test_torchrun_really_runs_two_processes(tmp_path):
    if shutil.which("torchrun") is None:
        pytest.skip("torchrun is not on PATH")
    data = write_toy_corpus(tmp_path / "data", n_train=400, n_valid=20, seed=0)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    done = subprocess.run(
        ["torchrun", "--nproc_per_node", "2", "-m", "hf_headattn.commands.train", *file_flags(data),
         "--output_dir", str(tmp_path / "run"), "--max_steps", "6", *TINY_MODEL],
        env=env, capture_output=True, text=True, timeout=600,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    results = json.loads((tmp_path / "run" / "train_results.json").read_text())
    assert results["world_size"] == 2
    assert (tmp_path / "run" / "model.safetensors").exists()
