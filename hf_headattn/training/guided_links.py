"""The word links guided alignment trains on (runtime/guided_alignment.py): read from a Pharaoh file or made by
eflomal from the training pairs, checked, mapped from words to subword positions, and put into batches.

Words are a sentence's whitespace-separated tokens, numbered from 0, as word aligners (eflomal, fast_align, Moses'
symmetrisers) and Pharaoh files number them. A Pharaoh file has one line per line of the training corpus (in the
files' order, blank pairs included), each a space-separated list of `i-j` links, source word i to target word j.
Links written `ipj` (a "possible" link of hand-made gold standards) are treated as sure links: they still say
which words correspond, and guided alignment has no use for the distinction (it is AER's).

A link between words i and j links every subword of source word i to every subword of target word j; each target
subword's links are a distribution (every linked source subword weighs the same), target subwords without links are
left out of the cost, and so are `</s>` and any other token without characters of the text.

Tooling, not model runtime: never copied into a checkpoint.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
from pathlib import Path

import torch

from ..file_cache import cached

logger = logging.getLogger(__name__)

EFLOMAL = "eflomal"
LINKS_COLUMN = "alignment_links"
PHARAOH_LINK = re.compile(r"(\d+)([-p])(\d+)")

WordLinks = list[tuple[int, int]]


# ------------------------------------------------------------------------------------------------ reading
def read_pharaoh(path: str | Path, pairs) -> list[WordLinks]:
    """Per pair of `pairs` ((source, target) texts, every line of the training corpus in order), the word links of
    the Pharaoh file at `path`, checked: one line per pair, every link `i-j` (or `ipj`) with i a word of the
    source sentence and j one of the target sentence. Raises ValueError naming the file, the line, the link and
    what is accepted."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as error:
        raise ValueError(f"--guided_alignment {path}: not UTF-8 text ({error}); a Pharaoh file is plain text, one "
                         "line of i-j links per sentence pair") from None
    return parse_pharaoh(text, pairs, f"--guided_alignment {path}")


def parse_pharaoh(text: str, pairs, where: str) -> list[WordLinks]:
    """:func:`read_pharaoh` of a Pharaoh file's text; `where` names the file in the errors."""
    lines = text.splitlines()
    pairs = list(pairs)
    if len(lines) != len(pairs):
        raise ValueError(f"{where}: {len(lines):,} lines for {len(pairs):,} training pairs; a Pharaoh file has one "
                         "line of links per line of the training corpus, in its order (blank pairs too)")
    links = []
    for number, (line, (source, target)) in enumerate(zip(lines, pairs), start=1):
        source_words, target_words = len(source.split()), len(target.split())
        sentence = []
        for link in line.split():
            match = PHARAOH_LINK.fullmatch(link)
            if match is None:
                raise ValueError(f"{where} line {number}: {link!r} is not a link; write i-j (source word i to "
                                 "target word j, counted from 0; ipj for a possible link), separated by spaces")
            i, j = int(match[1]), int(match[3])
            for side, index, words, sentence_text in (("source", i, source_words, source),
                                                      ("target", j, target_words, target)):
                if index >= words:
                    raise ValueError(f"{where} line {number}: link {link!r} names {side} word {index}, but the "
                                     f"{side} sentence has {words} word(s) (0..{words - 1}): {sentence_text[:80]!r}")
            sentence.append((i, j))
        links.append(sentence)
    return links


def pharaoh_text(links: list[WordLinks]) -> str:
    """A Pharaoh file's text: a line of `i-j` links per pair."""
    return "".join(" ".join(f"{i}-{j}" for i, j in sentence) + "\n" for sentence in links)


def links_fingerprint(pairs, **settings) -> str:
    """SHA-256 of the pairs' texts and the aligner's settings: the cache key of eflomal's links."""
    digest = hashlib.sha256(repr(sorted(settings.items())).encode())
    for source, target in pairs:
        digest.update(source.encode("utf-8") + b"\x00" + target.encode("utf-8") + b"\x01")
    return digest.hexdigest()


def links_cache_folder() -> Path:
    """Where eflomal's links are kept between runs: $HF_HEADATTN_CACHE/guided_alignment, by default under
    ~/.cache/hf_headattn (beside DROP's aligner cache, `metrics.drop`)."""
    root = os.environ.get("HF_HEADATTN_CACHE") or Path.home() / ".cache" / "hf_headattn"
    return Path(root) / "guided_alignment"


def eflomal_links(pairs, seed: int | None = None, cache_folder: Path | None = None) -> tuple[list[WordLinks], Path]:
    """Word links of the training pairs by eflomal, both directions symmetrised with grow-diag-final-and
    (`alignment.align_corpus`), and the Pharaoh file they are cached in (`file_cache`), named by the pairs'
    fingerprint: a run on the same pairs (a resumed run, or another model) reads them back instead of aligning
    again."""
    pairs = list(pairs)
    folder = cache_folder or links_cache_folder()
    path = folder / f"{links_fingerprint(pairs, aligner='eflomal', symmetrization='grow-diag-final-and')}.pharaoh"

    def align() -> list[WordLinks]:
        from ..alignment import align_corpus  # the package's name, looked up now

        return align_corpus([source.split() for source, _ in pairs], [target.split() for _, target in pairs],
                            seed=seed, progress=f"guided alignment: aligning {len(pairs):,} training pairs (eflomal)")

    links, was_cached = cached(path, align, parse=lambda text: parse_pharaoh(text, pairs, str(path)),
                               text=pharaoh_text, what="guided alignment links", log=logger)
    if was_cached:
        logger.info(f"guided alignment: the links of these {len(pairs):,} pairs from {path}")
    return links, path


# ------------------------------------------------------------------------------------------------ subwords
def _subword_words(text: str, offsets) -> list[int | None]:
    """Per subword (its character offsets in `text`), the index of the whitespace word its first non-space
    character lies in; None for tokens without characters (`</s>`, a lone "▁")."""
    word_of_char = [None] * len(text)
    for index, match in enumerate(re.finditer(r"\S+", text)):
        word_of_char[match.start():match.end()] = [index] * (match.end() - match.start())
    words = []
    for start, end in offsets:
        words.append(next((word_of_char[c] for c in range(start, min(end, len(text))) if word_of_char[c] is not None),
                          None))
    return words


def subword_links(tokenizer, sources: list[str], targets: list[str], word_links: list[WordLinks],
                  max_length: int) -> list[list[int]]:
    """Per pair, its word links as subword positions, flat: [target position, source position, ...] (the label
    position that predicts the target subword, and the source token's position). Needs a fast tokenizer, whose
    character offsets map subwords to words."""
    if not getattr(tokenizer, "is_fast", False):
        raise ValueError(f"guided alignment maps word links to subwords by the tokenizer's character offsets, which "
                         f"{type(tokenizer).__name__} (a slow tokenizer) does not give; use a fast tokenizer "
                         "(tokenizer.json), as the command trains")
    encode = dict(return_offsets_mapping=True, truncation=True, max_length=max_length)
    source_offsets = tokenizer(sources, **encode)["offset_mapping"]
    target_offsets = tokenizer(targets, **encode)["offset_mapping"]
    flat_links = []
    for source, target, links, source_spans, target_spans in zip(sources, targets, word_links, source_offsets,
                                                                 target_offsets):
        source_words, target_words = _subword_words(source, source_spans), _subword_words(target, target_spans)
        source_positions, target_positions = {}, {}
        for position, word in enumerate(source_words):
            source_positions.setdefault(word, []).append(position)
        for position, word in enumerate(target_words):
            target_positions.setdefault(word, []).append(position)
        flat = []
        for i, j in sorted(set(links)):
            for t in target_positions.get(j, ()):  # a word cut off by --max_length has no positions
                for s in source_positions.get(i, ()):
                    flat += (t, s)
        flat_links.append(flat)
    return flat_links


def links_matrix(flat_links: list[list[int]], target_length: int, source_length: int, target_offsets=None,
                 source_offsets=None) -> torch.Tensor:
    """[batch, target_length, source_length] float: each target position's links as a distribution over the source
    positions (equal weights), zeros where it has none. `*_offsets`: per row, how far padding on the left moved its
    positions (None: padded on the right)."""
    matrix = torch.zeros(len(flat_links), target_length, source_length)
    for row, flat in enumerate(flat_links):
        if not len(flat):
            continue
        pairs = torch.as_tensor(flat, dtype=torch.long).view(-1, 2)
        if target_offsets is not None:
            pairs = pairs + torch.tensor([target_offsets[row], source_offsets[row]])
        matrix[row, pairs[:, 0], pairs[:, 1]] = 1.0
    return matrix / matrix.sum(-1, keepdim=True).clamp(min=1.0)


class GuidedAlignmentCollator:
    """The run's collator (`DataCollatorForSeq2Seq`), and the rows' `alignment_links` (flat subword links, from
    `subword_links`) as the dense [batch, target, source] distributions the model takes. Batches without the column
    (validation) pass through unchanged."""

    def __init__(self, collator):
        self.collator = collator

    def __call__(self, features):
        if not features or LINKS_COLUMN not in features[0]:
            return self.collator(features)
        features = [dict(feature) for feature in features]
        flat_links = [feature.pop(LINKS_COLUMN) for feature in features]
        source_lengths = [len(feature["input_ids"]) for feature in features]
        target_lengths = [len(feature["labels"]) for feature in features]
        batch = self.collator(features)
        target_length, source_length = batch["labels"].shape[1], batch["input_ids"].shape[1]
        offsets = {}
        if getattr(self.collator.tokenizer, "padding_side", "right") == "left":
            offsets = dict(target_offsets=[target_length - n for n in target_lengths],
                           source_offsets=[source_length - n for n in source_lengths])
        batch[LINKS_COLUMN] = links_matrix(flat_links, target_length, source_length, **offsets)
        return batch


def add_links_column(train_dataset, flat_links: list[list[int]]):
    """`train_dataset` (the tokenised training pairs, in `train_text`'s order) with the `alignment_links` column."""
    from datasets import List, Value

    if len(flat_links) != len(train_dataset):
        raise ValueError(f"guided alignment: {len(flat_links):,} rows of links for {len(train_dataset):,} "
                         "training pairs")
    return train_dataset.add_column(LINKS_COLUMN, flat_links, feature=List(Value("int32")))


def training_word_links(source: str, sources: list[str], targets: list[str], corpus_pairs=None,
                        seed: int | None = None):
    """(word links per training pair, what the run manifest records of them), before any tokenizer exists.
    `source`: "eflomal" (align the training pairs `sources`/`targets`, or read their links back from the cache) or a
    Pharaoh file's path, whose lines are `corpus_pairs()`'s (every pair of the training files, in order:
    `parallel_data.iter_pairs`); the training pairs (blank pairs skipped, --max_train_pairs, a sample, the held-out
    5% left out) take their lines by their texts."""
    if source == EFLOMAL:
        word_links, cached = eflomal_links(zip(sources, targets), seed=seed)
        record = {"links": EFLOMAL, "symmetrization": "grow-diag-final-and", "cache": str(cached),
                  "sha256": _sha256(cached)}
    else:
        pairs = list(corpus_pairs())
        by_text = {}
        for pair, links in zip(pairs, read_pharaoh(source, pairs)):
            by_text.setdefault(pair, links)
        word_links = [by_text.get((s, t), []) for s, t in zip(sources, targets)]
        record = {"links": str(Path(source).resolve()), "sha256": _sha256(Path(source))}
    record["pairs_with_links"] = sum(1 for links in word_links if links)
    return word_links, record


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()
