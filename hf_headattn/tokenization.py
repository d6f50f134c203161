"""Train a joint SentencePiece-style subword tokenizer with Marian conventions (`<pad>`=0, `</s>`=1, `<unk>`=2)."""

from __future__ import annotations

import hashlib
import json
import logging
import os
from collections.abc import Iterable, Iterator
from pathlib import Path

from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
import transformers

from .parallel_data import iter_lines, scan_text_file

logger = logging.getLogger(__name__)

PAD_TOKEN = "<pad>"
EOS_TOKEN = "</s>"
UNK_TOKEN = "<unk>"
# Trainers give special tokens the first ids in list order, which is what pins pad/eos/unk to 0/1/2.
SPECIAL_TOKENS = (PAD_TOKEN, EOS_TOKEN, UNK_TOKEN)
SUPPORTED_MODELS = ("bpe", "unigram")

__all__ = ["encode_pairs", "load_tokenizer", "tokenizer_fingerprint", "train_tokenizer", "SPECIAL_TOKENS", "SUPPORTED_MODELS", "PAD_TOKEN", "EOS_TOKEN", "UNK_TOKEN"]

PathLike = str | os.PathLike


class PreTrainedTokenizerFast(transformers.PreTrainedTokenizerFast):
    """A tokenizer.json tokenizer that saves under a class name every supported Transformers release loads.

    Transformers 5 writes a tokenizer.json-only tokenizer's class as its own `TokenizersBackend`, which 4.x's
    `AutoTokenizer` rejects; it writes `type(self).__name__`, so this subclass saves as `PreTrainedTokenizerFast`,
    which 4.x loads as its fast tokenizer and 5.x as `TokenizersBackend` (its alias)."""


def load_tokenizer(name_or_path: PathLike, **kwargs):
    """`AutoTokenizer.from_pretrained`, except that a tokenizer.json-only tokenizer comes back as the portable
    `PreTrainedTokenizerFast` above, so that saving it again (the training command's checkpoints and output)
    keeps it loadable on Transformers 4.x; a local folder's tokenizer files are checked first
    (`saved_files.check_tokenizer_folder`: `DamagedFile` naming a missing, empty or cut-short file)."""
    # AutoTokenizer reads the folder's config.json too; registering this package's model types lets it read a
    # trained model's folder (or checkpoint) without asking whether to run the folder's code
    from . import auto_classes  # noqa: F401
    from .saved_files import check_tokenizer_folder

    if Path(name_or_path).is_dir():
        check_tokenizer_folder(name_or_path)
    tokenizer = transformers.AutoTokenizer.from_pretrained(name_or_path, **kwargs)
    if type(tokenizer) is transformers.PreTrainedTokenizerFast:
        return PreTrainedTokenizerFast.from_pretrained(name_or_path, **kwargs)
    return tokenizer


def encode_pairs(tokenizer, sources: list[str], targets: list[str], max_length: int) -> dict[str, list]:
    """`tokenizer(sources, text_target=targets)`'s `input_ids`, `attention_mask` and `labels`, a pair longer than
    `max_length` tokens on either side cut as `truncation=True` cuts it, and `truncated`: which pairs were cut.

    A tokenizer of this module's class (`train_tokenizer`'s, or a tokenizer.json one `load_tokenizer` read) has
    no target mode and no inputs beyond ids and mask: it is run through its Rust backend's `encode_batch_fast`
    (no character offsets, no per-sentence Python objects of Transformers), which gives the same ids about 1.4x
    faster than the call (examples/benchmark_data_prep.py). Any other tokenizer is called as usual."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if (type(tokenizer) is PreTrainedTokenizerFast and backend.truncation is None and backend.padding is None
            and list(tokenizer.model_input_names) == ["input_ids", "attention_mask"]):
        input_ids = [encoding.ids for encoding in backend.encode_batch_fast(sources)]
        encoded = {"input_ids": input_ids, "attention_mask": [[1] * len(ids) for ids in input_ids],
                   "labels": [encoding.ids for encoding in backend.encode_batch_fast(targets)]}
    else:
        encoded = dict(tokenizer(sources, text_target=targets, verbose=False))
    encoded["truncated"] = [len(source) > max_length or len(target) > max_length
                            for source, target in zip(encoded["input_ids"], encoded["labels"])]
    if long_rows := [row for row, truncated in enumerate(encoded["truncated"]) if truncated]:
        # rare: only these are tokenised again, by the call itself, so that they are cut as it cuts them
        shortened = tokenizer([sources[row] for row in long_rows], text_target=[targets[row] for row in long_rows],
                              max_length=max_length, truncation=True)
        for key, values in shortened.items():
            for row, value in zip(long_rows, values):
                encoded[key][row] = value
    return encoded


def tokenizer_fingerprint(tokenizer) -> str:
    """SHA-256 of what decides how a tokenizer maps text to ids: for a fast tokenizer its tokenizer.json pipeline
    (normalizer, pre-tokenizer, model with vocabulary and merges, post-processor, decoder, added tokens) without the
    truncation and padding state that calls set; otherwise its vocabulary. Equal for a tokenizer and its saved and
    reloaded copy; the training command records it with the model (`run_manifest`)."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None:
        pipeline = json.loads(backend.to_str())
        pipeline.pop("truncation", None)
        pipeline.pop("padding", None)
    else:
        pipeline = {"vocabulary": sorted(tokenizer.get_vocab().items())}
    return hashlib.sha256(json.dumps(pipeline, sort_keys=True, ensure_ascii=False).encode("utf-8")).hexdigest()


def train_tokenizer(
    files: PathLike | Iterable[PathLike] | None = None,
    vocab_size: int = 8000,
    *,
    texts: Iterable[str] | None = None,
    min_frequency: int = 2,
    model: str = "bpe",
    save_directory: PathLike | None = None,
    show_progress: bool = False,
    model_max_length: int = 512,
) -> PreTrainedTokenizerFast:
    """Train one subword vocabulary shared by source and target text.

    Args:
        files: Text file(s), one sentence per line (read as every command reads text: ``hf_headattn.parallel_data``,
            optionally ``.gz``/``.xz``); pass source and target files together for a joint vocabulary.
        vocab_size: Upper bound on the vocabulary size, special tokens included. Unigram may stop below it on
            small corpora; BPE may exceed it because every character seen in training is kept.
        texts: In-memory sentences, used in addition to ``files``.
        min_frequency: Minimum pair frequency for a BPE merge. The Unigram trainer has no such option and
            ignores it.
        model: ``"bpe"`` (default) or ``"unigram"`` (SentencePiece's default). BPE is the default because on
            corpora with few distinct words, such as :mod:`hf_headattn.toy_corpus`, the `tokenizers` Unigram trainer seeds only
            substrings shared by several word *types*, so there even frequent whole words end up split into
            characters (about 3 pieces per word on the toy corpus, against 1.1 with BPE).
        save_directory: If given, the tokenizer is written there with ``save_pretrained``.
        show_progress: Show the `tokenizers` training progress bar.
        model_max_length: Maximum sequence length used by ``truncation=True``.

    Returns:
        A ``PreTrainedTokenizerFast`` that appends ``</s>`` (no BOS), pads on the right with ``<pad>`` and
        supports ``tok(src, text_target=tgt)``; ``AutoTokenizer.from_pretrained`` reloads it without remote code.
    """
    model_name = _check_model(model)
    _check_int("vocab_size", vocab_size, minimum=len(SPECIAL_TOKENS) + 1)
    _check_int("min_frequency", min_frequency, minimum=0)
    _check_int("model_max_length", model_max_length, minimum=1)
    paths = _check_files(files)
    if isinstance(texts, (str, bytes)):
        raise TypeError("texts must be an iterable of sentences, not a single string")
    if not paths and texts is None:
        raise ValueError("No training data: pass files=... (text files, one sentence per line) and/or texts=...")

    backend, trainer = _untrained_tokenizer(model_name, vocab_size, min_frequency, show_progress)
    _train(backend, trainer, _iter_corpus(paths, texts), vocab_size=vocab_size, model_name=model_name)
    _append_eos(backend)
    tokenizer = _fast_tokenizer(backend, model_max_length)
    _report_vocabulary_size(tokenizer, backend, vocab_size, model_name, min_frequency)
    if save_directory is not None:
        tokenizer.save_pretrained(os.fspath(save_directory))
    return tokenizer


def _untrained_tokenizer(model_name: str, vocab_size: int, min_frequency: int,
                         show_progress: bool) -> tuple[Tokenizer, trainers.Trainer]:
    """An empty `model_name` tokenizer that handles text as SentencePiece does, and its trainer."""
    if model_name == "unigram":
        backend = Tokenizer(models.Unigram())
        trainer = trainers.UnigramTrainer(
            vocab_size=vocab_size,
            special_tokens=list(SPECIAL_TOKENS),
            unk_token=UNK_TOKEN,
            show_progress=show_progress,
        )
    else:
        # fuse_unk mirrors SentencePiece: a run of unknown characters becomes a single <unk>.
        backend = Tokenizer(models.BPE(unk_token=UNK_TOKEN, fuse_unk=True))
        trainer = trainers.BpeTrainer(
            vocab_size=vocab_size,
            min_frequency=min_frequency,
            special_tokens=list(SPECIAL_TOKENS),
            show_progress=show_progress,
        )
    # Collapsing/stripping whitespace matches SentencePiece's remove_extra_whitespaces; without it stray
    # spaces become lone "▁" pieces and decode() no longer reproduces the input.
    backend.normalizer = normalizers.Sequence(
        [normalizers.NFKC(), normalizers.Replace(Regex(r"\s+"), " "), normalizers.Strip()]
    )
    # SentencePiece never merges across Unicode script or number boundaries (split_by_unicode_script,
    # split_by_number), so "fence." is "▁fence" + ".". Splitting on whitespace alone would learn "▁fence." as its
    # own piece beside "▁fence": every sentence-final word twice over, and rarer words cut into more pieces.
    backend.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Metaspace(),
        pre_tokenizers.Split(Regex(r"▁?[\p{L}\p{M}]+|▁?\p{N}+|▁?[^\p{L}\p{M}\p{N}▁]+|▁+"), behavior="isolated"),
    ])
    backend.decoder = decoders.Metaspace()
    return backend, trainer


def _train(backend: Tokenizer, trainer: trainers.Trainer, sentences: Iterable[str], *, vocab_size: int,
           model_name: str) -> None:
    """Train `backend` on `sentences`, refusing (ValueError) a vocabulary too small for their alphabet or a corpus
    of blank lines only."""
    counter = _LineCounter(sentences)
    try:
        backend.train_from_iterator(counter, trainer=trainer)
    except Exception as err:
        # The Rust trainer reports this without saying which knob to turn.
        if "not large enough" in str(err):
            raise ValueError(
                f"vocab_size={vocab_size} is too small for this corpus: the {model_name} vocabulary must hold "
                f"every character of the training text plus {len(SPECIAL_TOKENS)} special tokens"
            ) from err
        raise
    if counter.count == 0:
        raise ValueError("The training corpus is empty: every file/text line is blank")


def _append_eos(backend: Tokenizer) -> None:
    """End every encoded text (one, or a pair) with ``</s>``, once the special tokens have their ids 0, 1, 2."""
    ids = {token: backend.token_to_id(token) for token in SPECIAL_TOKENS}
    if ids != {token: i for i, token in enumerate(SPECIAL_TOKENS)}:  # guards against a tokenizers behaviour change
        raise RuntimeError(f"Special token ids came out as {ids}, expected <pad>=0, </s>=1, <unk>=2")
    backend.post_processor = processors.TemplateProcessing(
        single=f"$A {EOS_TOKEN}",
        pair=f"$A $B {EOS_TOKEN}",
        special_tokens=[(EOS_TOKEN, ids[EOS_TOKEN])],
    )


def _fast_tokenizer(backend: Tokenizer, model_max_length: int) -> PreTrainedTokenizerFast:
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        pad_token=PAD_TOKEN,
        eos_token=EOS_TOKEN,
        unk_token=UNK_TOKEN,
        model_max_length=model_max_length,
        model_input_names=["input_ids", "attention_mask"],  # 4.x would add token_type_ids
        padding_side="right",
        truncation_side="right",
        # Already False by default in 5.x; pinned so decode() keeps " ." and " ," exactly as in the corpus.
        clean_up_tokenization_spaces=False,
    )


def _report_vocabulary_size(tokenizer: PreTrainedTokenizerFast, backend: Tokenizer, vocab_size: int,
                            model_name: str, min_frequency: int) -> None:
    """Say why the vocabulary is not of `vocab_size` tokens: over it (a warning), or under it."""
    if len(tokenizer) > vocab_size:  # BPE keeps every character it saw
        alphabet = len(backend.get_vocab()) - len(SPECIAL_TOKENS) if model_name == "bpe" else None
        logger.warning(f"vocab_size={vocab_size} is smaller than the training text's alphabet ({alphabet} characters "
                       f"and {len(SPECIAL_TOKENS)} special tokens): trained a vocabulary of {len(tokenizer)} instead")
    elif len(tokenizer) < vocab_size:
        logger.info(f"vocab_size={vocab_size}: the training text yields {len(tokenizer)} {model_name} tokens "
                    f"(merges of frequency >= {min_frequency})" if model_name == "bpe" else
                    f"vocab_size={vocab_size}: the unigram trainer stopped at {len(tokenizer)} tokens")


def _check_model(model: str) -> str:
    name = model.lower() if isinstance(model, str) else None
    if name not in SUPPORTED_MODELS:
        accepted = ", ".join(repr(m) for m in SUPPORTED_MODELS)
        raise ValueError(f"Unsupported tokenizer model {model!r}; accepted values: {accepted}")
    return name


def _check_int(name: str, value: object, *, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {value!r}")
    if value < minimum:
        if name == "vocab_size":
            raise ValueError(
                f"vocab_size={value} is too small: it must be larger than the {len(SPECIAL_TOKENS)} special "
                f"tokens {', '.join(SPECIAL_TOKENS)}"
            )
        raise ValueError(f"{name}={value} must be >= {minimum}")


def _check_files(files: PathLike | Iterable[PathLike] | None) -> list[Path]:
    if files is None:
        return []
    if isinstance(files, (str, os.PathLike)):
        files = [files]
    paths = []
    for f in files:
        if not isinstance(f, (str, os.PathLike)):
            raise TypeError(f"files must be paths (str or os.PathLike), got {f!r}")
        path = Path(f)
        # Checked up front so a typo in the last file does not surface only after reading all the others.
        if not path.exists():
            raise FileNotFoundError(f"Training file does not exist: {os.fspath(f)}")
        if not path.is_file():
            raise IsADirectoryError(f"Training path is not a regular file: {os.fspath(f)}")
        scan_text_file(path)  # text that is not UTF-8 is named (file, line, byte) before training starts
        paths.append(path)
    return paths


def _iter_corpus(paths: list[Path], texts: Iterable[str] | None) -> Iterator[str]:
    for path in paths:
        yield from (line for line in iter_lines(path) if line.strip())  # read as every command reads text
    if texts is not None:
        for text in texts:
            if not isinstance(text, str):
                raise TypeError(f"texts must contain strings, got {type(text).__name__}: {text!r}")
            if text.strip():
                yield text


class _LineCounter:
    """Counts the lines fed to the trainer, which itself happily trains on nothing."""

    def __init__(self, lines: Iterator[str]):
        self._lines = lines
        self.count = 0

    def __iter__(self) -> Iterator[str]:
        for line in self._lines:
            self.count += 1
            yield line
