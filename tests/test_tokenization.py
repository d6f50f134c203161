import os

import pytest
from transformers import AutoTokenizer, PreTrainedTokenizerFast

from hf_headattn.tokenization import SPECIAL_TOKENS, load_tokenizer, train_tokenizer
from hf_headattn.toy_corpus import make_toy_corpus, write_toy_corpus

VOCAB_SIZE = 300


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return write_toy_corpus(tmp_path_factory.mktemp("toy"), n_train=1000, n_valid=50, seed=0)


@pytest.fixture(scope="module")
def tok(corpus):
    return train_tokenizer([corpus["train.src"], corpus["train.tgt"]], vocab_size=VOCAB_SIZE)


def read_lines(path):
    with open(path, encoding="utf-8") as handle:
        return handle.read().splitlines()


def test_returns_fast_tokenizer_with_marian_special_ids(tok):
    assert isinstance(tok, PreTrainedTokenizerFast)
    assert (tok.pad_token_id, tok.eos_token_id, tok.unk_token_id) == (0, 1, 2)
    assert tok.convert_ids_to_tokens([0, 1, 2]) == ["<pad>", "</s>", "<unk>"]
    assert tok.bos_token is None
    assert tok.padding_side == "right"
    assert tok.model_max_length == 512
    assert 3 < len(tok) <= VOCAB_SIZE


def test_vocabulary_is_joint(tok, corpus):
    # Whole frequent words of both languages should be single pieces (or at least not <unk>).
    for sentence in read_lines(corpus["train.src"])[:50] + read_lines(corpus["train.tgt"])[:50]:
        assert tok.unk_token_id not in tok(sentence)["input_ids"], sentence


def test_eos_appended_without_bos(tok):
    ids = tok("der hund schläft .")["input_ids"]
    assert ids[-1] == tok.eos_token_id
    assert ids.count(tok.eos_token_id) == 1
    assert ids[0] not in (0, 1, 2)
    pair = tok("der hund", "schläft .")["input_ids"]
    assert pair[-1] == 1 and pair.count(1) == 1


def test_text_target_gives_labels_and_right_padding(tok):
    src = ["der hund schläft .", "ich weiß dass die kleine katze den roten ball sieht ."]
    tgt = ["the dog sleeps .", "i know that the small cat sees the red ball ."]
    enc = tok(src, text_target=tgt, padding=True, truncation=True)
    assert {"input_ids", "attention_mask", "labels"} <= set(enc)
    short, long = enc["input_ids"]
    assert len(short) == len(long)
    n_real = sum(enc["attention_mask"][0])
    assert short[n_real - 1] == 1 and set(short[n_real:]) == {0} and n_real < len(short)
    assert enc["attention_mask"][0][n_real:] == [0] * (len(short) - n_real)
    assert enc["labels"][0][: len(tok(tgt[0])["input_ids"])] == tok(tgt[0])["input_ids"]
    assert enc["labels"][1] == tok(tgt[1])["input_ids"]


def test_truncation_keeps_eos(corpus):
    tok = train_tokenizer(corpus["train.src"], vocab_size=VOCAB_SIZE, model_max_length=5)
    ids = tok("ich weiß dass die kleine katze den roten ball sieht .", truncation=True)["input_ids"]
    assert len(ids) == 5 and ids[-1] == 1


def test_decode_round_trips_toy_sentences(tok, corpus):
    sentences = read_lines(corpus["valid.src"]) + read_lines(corpus["valid.tgt"])
    for sentence in sentences:
        ids = tok(sentence)["input_ids"]
        assert tok.decode(ids, skip_special_tokens=True) == sentence
    batch = tok(sentences[:8], padding=True)["input_ids"]
    assert tok.batch_decode(batch, skip_special_tokens=True) == sentences[:8]
    assert tok.decode(tok(sentences[0])["input_ids"]).endswith("</s>")


def test_normalization_collapses_whitespace_and_applies_nfkc(tok):
    assert tok("  der   hund\tschläft . ")["input_ids"] == tok("der hund schläft .")["input_ids"]
    # "ﬁ" (U+FB01) is NFKC-normalized to "fi".
    assert tok("ﬁsch")["input_ids"] == tok("fisch")["input_ids"]


def test_save_and_autotokenizer_reload_encode_identically(tok, corpus, tmp_path):
    tok.save_pretrained(tmp_path)
    assert (tmp_path / "tokenizer.json").is_file()
    reloaded = AutoTokenizer.from_pretrained(tmp_path)
    assert isinstance(reloaded, PreTrainedTokenizerFast)
    assert (reloaded.pad_token_id, reloaded.eos_token_id, reloaded.unk_token_id) == (0, 1, 2)
    assert reloaded.padding_side == "right" and reloaded.model_max_length == 512
    src = read_lines(corpus["valid.src"])[:16]
    tgt = read_lines(corpus["valid.tgt"])[:16]
    kwargs = dict(text_target=tgt, padding=True, truncation=True)
    assert dict(reloaded(src, **kwargs)) == dict(tok(src, **kwargs))
    assert reloaded.get_vocab() == tok.get_vocab()


def test_save_directory_argument_and_bpe(corpus, tmp_path):
    out = tmp_path / "bpe_tok"
    files = [str(corpus["train.src"]), corpus["train.tgt"]]  # mixed str / Path on purpose
    tok = train_tokenizer(files, vocab_size=200, model="BPE", min_frequency=2, save_directory=out)
    assert (out / "tokenizer.json").is_file() and (out / "tokenizer_config.json").is_file()
    assert (tok.pad_token_id, tok.eos_token_id, tok.unk_token_id) == (0, 1, 2)
    reloaded = AutoTokenizer.from_pretrained(out)
    for sentence in read_lines(corpus["valid.tgt"])[:20] + read_lines(corpus["valid.src"])[:20]:
        ids = tok(sentence)["input_ids"]
        assert ids[-1] == 1
        assert reloaded(sentence)["input_ids"] == ids
        assert tok.decode(ids, skip_special_tokens=True) == sentence


def test_in_memory_texts_alone_and_combined_with_files(corpus):
    pairs = make_toy_corpus(300, seed=4)
    texts = (s for pair in pairs for s in pair)  # a one-shot iterator must be fine
    tok = train_tokenizer(texts=texts, vocab_size=150)
    assert tok.convert_ids_to_tokens([0, 1, 2]) == ["<pad>", "</s>", "<unk>"]
    assert tok.decode(tok(pairs[0][0])["input_ids"], skip_special_tokens=True) == pairs[0][0]
    combined = train_tokenizer(corpus["train.src"], vocab_size=150, texts=["the quick zebra ."])
    assert combined.unk_token_id not in combined("zebra")["input_ids"]


def test_missing_file_is_reported_before_training(corpus, tmp_path):
    missing = tmp_path / "does_not_exist.txt"
    with pytest.raises(FileNotFoundError, match="does_not_exist.txt"):
        train_tokenizer([corpus["train.src"], missing])


def test_directory_instead_of_file(tmp_path):
    with pytest.raises(IsADirectoryError, match="not a regular file"):
        train_tokenizer(tmp_path)


@pytest.mark.parametrize("files", [None, []])
def test_no_training_data(files):
    with pytest.raises(ValueError, match="No training data"):
        train_tokenizer(files)


def test_empty_corpus(tmp_path):
    empty = tmp_path / "empty.txt"
    empty.write_text("\n  \n", encoding="utf-8")
    with pytest.raises(ValueError, match="corpus is empty"):
        train_tokenizer(empty)


@pytest.mark.parametrize("size", [0, 3])
def test_vocab_size_too_small_for_special_tokens(corpus, size):
    with pytest.raises(ValueError, match=f"vocab_size={size} is too small"):
        train_tokenizer(corpus["train.src"], vocab_size=size)


def test_unigram_vocab_size_too_small_for_alphabet(corpus):
    with pytest.raises(ValueError, match="vocab_size=10 is too small for this corpus"):
        train_tokenizer(corpus["train.src"], vocab_size=10, model="unigram")


def test_unknown_model_name(corpus):
    with pytest.raises(ValueError, match=r"'wordpiece'.*'bpe', 'unigram'"):
        train_tokenizer(corpus["train.src"], model="wordpiece")


def test_texts_must_not_be_a_single_string():
    with pytest.raises(TypeError, match="not a single string"):
        train_tokenizer(texts="der hund schläft .")



def test_saved_tokenizers_name_a_class_every_supported_transformers_loads(tok, tmp_path):
    """Transformers 5 would write `TokenizersBackend`, which 4.x's AutoTokenizer rejects (the slow version matrix
    loads these folders on 4.57); re-saving a loaded tokenizer keeps the portable name."""
    import json

    tok.save_pretrained(tmp_path / "trained")
    config = json.loads((tmp_path / "trained" / "tokenizer_config.json").read_text())
    assert config["tokenizer_class"] == "PreTrainedTokenizerFast"
    assert config["model_input_names"] == ["input_ids", "attention_mask"]  # 4.x would add token_type_ids
    load_tokenizer(tmp_path / "trained").save_pretrained(tmp_path / "resaved")
    resaved = json.loads((tmp_path / "resaved" / "tokenizer_config.json").read_text())
    assert resaved["tokenizer_class"] == "PreTrainedTokenizerFast"
    assert load_tokenizer(tmp_path / "resaved")("ein hund .").input_ids == tok("ein hund .").input_ids


def test_load_tokenizer_reads_a_model_folder_without_asking_to_run_its_code(tok, tmp_path):
    """A trained model's folder (or a checkpoint, which the training command resumes from) has a config.json with
    auto_map; AutoTokenizer reads it, and without the package's model types registered it would ask whether to run
    the folder's code (blocking a terminal) and warn about an unknown model type."""
    import subprocess
    import sys

    from helpers import REPO, tiny_config

    tiny_config().save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    script = (f"from hf_headattn.tokenization import load_tokenizer\n"
              f"print(load_tokenizer({str(tmp_path)!r})('ein hund .').input_ids)\n")
    finished = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True, cwd=REPO,
                              stdin=subprocess.DEVNULL)
    assert finished.stdout.strip() == str(tok("ein hund .").input_ids)
    assert "custom code" not in finished.stderr and "model of type" not in finished.stderr, finished.stderr


def test_punctuation_is_split_from_words_as_sentencepiece_does():
    """SentencePiece never merges across script or number boundaries; a whitespace-only split would learn
    "▁fence." beside "▁fence" (on Multi30k, 1,246 of 8,000 pieces were such word+punctuation pieces)."""
    sentences = ["A dog runs along the fence.", "The fence is white, and a dog sits by the fence."] * 50
    tokenizer = train_tokenizer(texts=sentences + ["3-year-old"], vocab_size=120)
    pieces = tokenizer.convert_ids_to_tokens(tokenizer("A dog sits by the fence.").input_ids)
    assert pieces[-3:] == ["▁fence", ".", "</s>"]
    mixed = [piece for piece in tokenizer.get_vocab() if any(c.isalnum() for c in piece)
             and any(not c.isalnum() and c != "▁" for c in piece) and piece not in SPECIAL_TOKENS]
    assert not mixed, mixed
    for text in ["The fence is white, and a dog sits by the fence.", "3-year-old", "ein hund ."]:
        assert tokenizer.decode(tokenizer(text).input_ids, skip_special_tokens=True) == text


def test_encode_pairs_gives_the_calls_ids_and_cuts_long_pairs_as_it_does(tok, corpus):
    """The fast path (the Rust backend's encode_batch_fast) and the tokenizer's own call agree, long pairs
    included; a tokenizer of another class goes through the call."""
    from hf_headattn.tokenization import PreTrainedTokenizerFast as Portable, encode_pairs

    sources = read_lines(corpus["train.src"])[:40] + ["", " ".join(read_lines(corpus["train.src"])[:6])]
    targets = read_lines(corpus["train.tgt"])[:40] + ["", "kurz"]
    assert type(tok) is Portable
    for max_length in (512, 12):
        encoded = encode_pairs(tok, sources, targets, max_length)
        called = tok(sources, text_target=targets, max_length=max_length, truncation=True)
        assert {key: encoded[key] for key in ("input_ids", "attention_mask", "labels")} == dict(called)
        assert encoded["truncated"] == [len(tok(s)["input_ids"]) > max_length or len(tok(t)["input_ids"]) > max_length
                                        for s, t in zip(sources, targets)]
    assert any(encode_pairs(tok, sources, targets, 12)["truncated"])

    class Other(PreTrainedTokenizerFast):  # a subclass may have a target mode of its own: called as usual
        def __call__(self, *args, **kwargs):
            self.called = True
            return super().__call__(*args, **kwargs)

    other = Other(tokenizer_object=tok.backend_tokenizer, pad_token="<pad>", eos_token="</s>", unk_token="<unk>")
    assert encode_pairs(other, sources, targets, 512)["labels"] == tok(text_target=targets)["input_ids"]
    assert other.called


def test_tokenisation_uses_every_core_for_a_large_corpus_only(monkeypatch):
    from hf_headattn.training import data

    monkeypatch.setattr(data.os, "sched_getaffinity", lambda pid: {0, 1, 2, 3}, raising=False)
    assert data.tokenization_processes(2_900_000, None) == 4
    assert data.tokenization_processes(1_000, None) is None  # a pool's start-up costs more than it saves
    assert data.tokenization_processes(2_900_000, 1) == 1  # --preprocessing_num_workers decides


def test_tokenisation_over_two_processes_gives_what_one_gives(tok, corpus, monkeypatch):
    import datasets

    from hf_headattn.training.data import tokenize_parallel

    monkeypatch.delenv("TOKENIZERS_PARALLELISM", raising=False)
    pairs = datasets.Dataset.from_dict({"source": read_lines(corpus["train.src"])[:300],
                                        "target": read_lines(corpus["train.tgt"])[:300]})
    alone = tokenize_parallel(pairs, tok, max_length=16, num_proc=None)
    pooled = tokenize_parallel(pairs, tok, max_length=16, num_proc=2)
    assert alone.to_dict() == pooled.to_dict() and alone.column_names == ["input_ids", "labels"]
    assert "TOKENIZERS_PARALLELISM" not in os.environ  # set for the pool only


def test_tokenisation_in_one_process_keeps_the_tokenizers_threads(tok, corpus, monkeypatch):
    """Without a pool (a small corpus) the Rust tokenizer encodes on every core; only a pool's processes, forked
    after the tokenizer's training ran threads, are held to one thread each."""
    import datasets

    from hf_headattn import tokenization
    from hf_headattn.training.data import tokenize_parallel

    monkeypatch.delenv("TOKENIZERS_PARALLELISM", raising=False)
    seen, tokenization_encode_pairs = [], tokenization.encode_pairs

    def encode_pairs(*args):
        seen.append(os.environ.get("TOKENIZERS_PARALLELISM"))
        return tokenization_encode_pairs(*args)

    monkeypatch.setattr(tokenization, "encode_pairs", encode_pairs)
    pairs = datasets.Dataset.from_dict({"source": read_lines(corpus["train.src"])[:50],
                                        "target": read_lines(corpus["train.tgt"])[:50]})
    tokenize_parallel(pairs, tok, max_length=16, num_proc=None)
    assert seen and set(seen) == {None}
