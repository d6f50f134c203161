"""Word alignment and fertility tooling for the GUIDED and PREDICTED fertility bounds (Malaviya et al., 2018, Sec. 4).

The paper aligns the training data with fast_align and derives per-word fertilities from the alignments. Here the
aligner is eflomal (fast_align's successor: a Bayesian IBM/HMM/fertility model with Gibbs sampling), run in both
directions and symmetrized with grow-diag-final-and, the usual recipe for both tools.

The pipeline, over the subword tokens exactly as the NMT model sees them:

1. :func:`corpus_token_fertilities`: tokenize the parallel corpus with the model's tokenizer, align the token
   sequences (:func:`align_corpus`) and count, for every source token, how many target tokens are linked to it
   (:func:`fertilities_from_alignments`).
2. GUIDED: :func:`guided_fertility_table` keeps, per token id, the largest fertility seen (1 if none); the model
   looks the table up at run time (``hf_headattn.runtime.fertility.source_fertility``).
3. PREDICTED: :func:`train_fertility_predictor` trains the bi-LSTM tagger
   (``hf_headattn.runtime.fertility.FertilityPredictor``) on those fertilities plus one slack.

Special tokens. Every sequence ends in ``</s>`` on both sides, and both ``</s>`` take part in the alignment like
any other token: they co-occur in every sentence pair at the same relative (final) position, so the aligner links
them to each other and the source ``</s>`` ends up with fertility 1 (tested). This matches the model, whose
decoder spends one step (and one unit of attention) on generating the target ``</s>``, and keeps the sum of the
fertilities close to the number of decoder steps. No special case is needed at run time either.

This module is tooling: it is not copied into saved checkpoints and may import eflomal, numpy, tqdm and
transformers.
"""

from __future__ import annotations

import contextlib
import inspect
import io
import logging
import os
import re
import sys
import tempfile
import threading
import warnings
from collections.abc import Hashable, Mapping, Sequence

import torch
from torch.nn import functional as F
from tqdm.auto import tqdm

from .runtime.fertility import FertilityPredictor

logger = logging.getLogger(__name__)


__all__ = [
    "SYMMETRIZATIONS",
    "align_corpus",
    "alignment_priors",
    "corpus_token_fertilities",
    "fertilities_from_alignments",
    "grow_diag_final_and",
    "guided_fertility_table",
    "symmetrize",
    "train_fertility_predictor",
]

SYMMETRIZATIONS = ("grow-diag-final-and", "intersection", "union")

# eflomal's input writer stores sentences of this many tokens or more as empty sentences (no links).
EFLOMAL_MAX_SENTENCE_LENGTH = 0x400

# Grid neighbours in the order of Koehn's pseudo-code: the four direct ones first, then the diagonals.
_NEIGHBOURS = ((-1, 0), (0, -1), (1, 0), (0, 1), (-1, -1), (-1, 1), (1, -1), (1, 1))

Links = list[tuple[int, int]]


# ---------------------------------------------------------------------------------------------------------------
# Symmetrization
# ---------------------------------------------------------------------------------------------------------------


def grow_diag_final_and(
    forward: Sequence[tuple[int, int]],
    reverse: Sequence[tuple[int, int]],
    source_length: int,
    target_length: int,
) -> Links:
    """Symmetrize two directional alignments with grow-diag-final-and (Koehn et al., 2003; Moses' default).

    Both inputs are lists of ``(source index, target index)`` links. The algorithm:

    1. Start from the intersection of the two alignments (high precision).
    2. GROW-DIAG: repeat until nothing changes: for every current link, in (source, target) order, look at its
       8 neighbours (left/right/up/down, then the diagonals); add a neighbour that lies in the *union* if its
       source token or its target token is still unaligned.
    3. FINAL-AND, first for ``forward`` then for ``reverse``: add a link of that direction if *both* its source
       and its target token are still unaligned.

    One deterministic detail differs between implementations: links added during a GROW-DIAG pass are expanded
    in the next pass (passes repeat until none adds a link), rather than later in the same pass.

    Returns:
        The symmetrized links, sorted.
    """
    forward_set, reverse_set = _check_links(forward, source_length, target_length), _check_links(
        reverse, source_length, target_length
    )
    union = forward_set | reverse_set
    alignment = forward_set & reverse_set
    aligned_sources = {i for i, _ in alignment}
    aligned_targets = {j for _, j in alignment}

    def add(i: int, j: int) -> None:
        alignment.add((i, j))
        aligned_sources.add(i)
        aligned_targets.add(j)

    grew = True
    while grew:
        grew = False
        for i, j in sorted(alignment):
            for di, dj in _NEIGHBOURS:
                point = (i + di, j + dj)
                if point in union and point not in alignment and (
                    point[0] not in aligned_sources or point[1] not in aligned_targets
                ):
                    add(*point)
                    grew = True

    for direction in (forward_set, reverse_set):
        for i, j in sorted(direction):
            if i not in aligned_sources and j not in aligned_targets:
                add(i, j)
    return sorted(alignment)


def symmetrize(
    forward: Sequence[tuple[int, int]],
    reverse: Sequence[tuple[int, int]],
    source_length: int,
    target_length: int,
    method: str = "grow-diag-final-and",
) -> Links:
    """Combine two directional alignments: ``"grow-diag-final-and"`` (default), ``"intersection"`` or ``"union"``.

    Intersection is precise but drops every many-to-one link, so it caps fertilities at 1; union keeps every
    link of both directions, including their errors. grow-diag-final-and sits in between; it is the default of
    eflomal's own symmetrizing script and the usual ``atools -c`` choice with fast_align.
    """
    if method == "grow-diag-final-and":
        return grow_diag_final_and(forward, reverse, source_length, target_length)
    forward_set = _check_links(forward, source_length, target_length)
    reverse_set = _check_links(reverse, source_length, target_length)
    if method == "intersection":
        return sorted(forward_set & reverse_set)
    if method == "union":
        return sorted(forward_set | reverse_set)
    raise ValueError(f"Unknown symmetrization {method!r}; accepted: {', '.join(SYMMETRIZATIONS)}")


def _check_links(links: Sequence[tuple[int, int]], source_length: int, target_length: int) -> set[tuple[int, int]]:
    checked = set()
    for link in links:
        i, j = (int(x) for x in link)
        if not (0 <= i < source_length and 0 <= j < target_length):
            raise ValueError(
                f"Alignment link {tuple(link)} out of range for a {source_length}-token source and "
                f"{target_length}-token target"
            )
        checked.add((i, j))
    return checked


# ---------------------------------------------------------------------------------------------------------------
# eflomal
# ---------------------------------------------------------------------------------------------------------------


def _eflomal_lines(sentences: Sequence[Sequence[Hashable]], side: str, index: dict | None = None) -> list[str]:
    """One line per sentence, every token replaced by a number that is unique to its type on this side.

    eflomal splits lines on whitespace and lowercases words; numbering the types first makes any hashable token
    (subword strings with spaces or capitals, token ids) safe and keeps distinct tokens distinct. `index` (token ->
    number, extended in place) carries one numbering over several runs, as priors from an earlier run need.
    """
    index = {} if index is None else index
    lines = []
    for k, sentence in enumerate(sentences):
        if isinstance(sentence, (str, bytes)):
            raise TypeError(f"{side} sentence {k} is a string; pass a list of tokens (e.g. text.split())")
        lines.append(" ".join(str(index.setdefault(token, len(index))) for token in sentence) + "\n")
    return lines


def _read_links(path: str, n_sentences: int, direction: str) -> list[Links]:
    if not os.path.exists(path):
        raise RuntimeError(f"eflomal wrote no {direction} alignments; run with quiet=False to see its messages")
    with open(path, encoding="utf-8") as handle:
        lines = handle.read().split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    if len(lines) != n_sentences:
        raise RuntimeError(
            f"eflomal wrote {len(lines)} {direction} alignment lines for {n_sentences} sentence pairs; "
            "run with quiet=False to see its messages"
        )
    return [[tuple(int(x) for x in link.split("-")) for link in line.split()] for line in lines]


def align_corpus(
    source_tokens: list[list[str]],
    target_tokens: list[list[str]],
    *,
    seed: int | None = None,
    symmetrization: str = "grow-diag-final-and",
    quiet: bool = True,
    priors: Mapping | None = None,
    progress: str | None = None,
    **aligner_options,
) -> list[Links]:
    """Word-align a tokenized parallel corpus with eflomal and symmetrize the two directions.

    eflomal is run once, producing the forward alignment (every target token linked to at most one source
    token, so source tokens can have several) and the reverse alignment (every source token linked to at most
    one target token); :func:`symmetrize` combines them, by default with grow-diag-final-and.

    Args:
        source_tokens: Per sentence, the source tokens (strings, or any hashable such as token ids).
        target_tokens: Per sentence, the target tokens; as many sentences as ``source_tokens``.
        seed: eflomal 2.0 seeds its Gibbs samplers from ``/dev/urandom`` and has no option to fix them, so
            alignments can differ slightly between runs. A seed is passed on if the installed eflomal accepts
            one; otherwise a non-None seed only triggers a warning that the run is not reproducible.
        symmetrization: ``"grow-diag-final-and"`` (default), ``"intersection"`` or ``"union"``.
        quiet: Silence eflomal's progress messages.
        progress: Show a progress bar with this description over eflomal's sampling iterations instead.
        priors: What :func:`alignment_priors` learned from another corpus: eflomal then aligns this one as if
            trained on that corpus too (its ``--priors``), at the cost of aligning this corpus alone.
        **aligner_options: Passed to ``eflomal.Aligner``, e.g. ``model`` (1 = IBM1, 2 = HMM, 3 = HMM + fertility,
            the default), ``n_samplers``, ``rel_iterations``, ``n_iterations``, ``null_prior``. The prefix/suffix
            stemming options are rejected: tokens reach eflomal as numbers.

    Returns:
        Per sentence, the sorted ``(source index, target index)`` links. Sentences where either side is empty,
        or either side has 1024 tokens or more (eflomal skips those), get no links.
    """
    try:
        import eflomal
    except ImportError as error:
        raise ImportError("align_corpus needs the eflomal word aligner: `pip install eflomal`") from error

    if len(source_tokens) != len(target_tokens):
        raise ValueError(
            f"The corpus sides differ in length: {len(source_tokens)} source and {len(target_tokens)} target sentences"
        )
    if symmetrization not in SYMMETRIZATIONS:
        raise ValueError(f"Unknown symmetrization {symmetrization!r}; accepted: {', '.join(SYMMETRIZATIONS)}")
    stemming = [k for k in aligner_options if k.endswith(("_prefix_len", "_suffix_len")) and aligner_options[k]]
    if stemming:
        raise ValueError(f"align_corpus does not support eflomal's stemming options {stemming}: tokens are numbered")
    if len(source_tokens) == 0:
        return []

    numbers = ({}, {}) if priors is None else (dict(priors["source_numbers"]), dict(priors["target_numbers"]))
    source_lines = _eflomal_lines(source_tokens, "source", numbers[0])
    target_lines = _eflomal_lines(target_tokens, "target", numbers[1])
    too_long = sum(
        1
        for source, target in zip(source_tokens, target_tokens)
        if max(len(source), len(target)) >= EFLOMAL_MAX_SENTENCE_LENGTH
    )
    if too_long:
        warnings.warn(
            f"{too_long} sentence pair(s) have {EFLOMAL_MAX_SENTENCE_LENGTH} tokens or more on a side; eflomal "
            "skips them, so they get no alignment links",
            stacklevel=2,
        )

    align_kwargs = {"quiet": quiet}
    if priors is not None:
        align_kwargs["priors_input"] = io.StringIO(priors["priors"])
    if seed is not None:
        if "seed" in inspect.signature(eflomal.Aligner.align).parameters:
            align_kwargs["seed"] = seed
        else:
            # a log line, not a warning: nothing the user can do about it (eflomal releases take no seed)
            logger.info(
                "eflomal cannot be seeded (it draws its random state from /dev/urandom): `seed` is ignored and "
                "alignments may differ slightly between runs"
            )

    forward, reverse = _run_eflomal(eflomal.Aligner(**aligner_options), source_lines, target_lines, align_kwargs,
                                    progress)
    return [
        symmetrize(fwd, rev, len(source), len(target), method=symmetrization)
        for fwd, rev, source, target in zip(forward, reverse, source_tokens, target_tokens)
    ]


def _run_eflomal(aligner, source_lines: list[str], target_lines: list[str], align_kwargs: dict,
                 progress: str | None = None):
    """One eflomal run: (forward links, reverse links) per sentence pair; with `progress`, a progress bar of that
    description follows eflomal's sampling iterations."""
    with tempfile.TemporaryDirectory(prefix="hf_headattn_align_") as directory:
        forward_path = os.path.join(directory, "forward.links")
        reverse_path = os.path.join(directory, "reverse.links")
        run = contextlib.nullcontext()
        if progress is not None:  # the bar is driven by the messages eflomal's quiet mode would silence
            run, align_kwargs = _eflomal_progress(progress), {**align_kwargs, "quiet": False}
        with run:
            aligner.align(source_lines, target_lines, links_filename_fwd=forward_path,
                          links_filename_rev=reverse_path, **align_kwargs)
        return _read_links(forward_path, len(source_lines), "forward"), _read_links(reverse_path, len(source_lines),
                                                                                      "reverse")


_EFLOMAL_ITERATIONS = re.compile(r" -([123]) (\d+)")  # the command line eflomal echoes: -1 N1 -2 N2 -3 N3
_EFLOMAL_MODEL_DONE = re.compile(r"^Done: ")
# What the eflomal binary reports besides the iteration counts (swallowed, as its quiet mode does).
_EFLOMAL_MESSAGES = ("Read texts", "Vocabulary sizes", "Created alignment structures", "Randomized alignment",
                     "Aligning with model", "Final argmax", "Writing alignments", "Done: ")


@contextlib.contextmanager
def _eflomal_progress(description: str):
    """A progress bar over eflomal's Gibbs sampling iterations, read from what the eflomal binary writes to the
    process's stderr (file descriptor 2, so it is redirected at the OS level for the call): the iteration counts of
    its models from the command line it echoes, then one model finished per two "Done" lines (both directions run
    side by side). Anything else written to stderr meanwhile is passed through."""
    sys.stderr.flush()
    saved_stderr = os.dup(2)
    read_end, write_end = os.pipe()
    os.dup2(write_end, 2)
    os.close(write_end)
    terminal = os.fdopen(os.dup(saved_stderr), "w", buffering=1)
    bar = tqdm(desc=description, unit="iteration", file=terminal)

    def follow():
        model_iterations, finished_halves = [], 0
        with os.fdopen(read_end, errors="replace") as lines:
            for line in lines:
                if not model_iterations and "eflomal" in line and _EFLOMAL_ITERATIONS.search(line):
                    model_iterations = [int(count) for _, count in sorted(_EFLOMAL_ITERATIONS.findall(line))
                                        if int(count) > 0]
                    bar.reset(total=sum(model_iterations))
                elif _EFLOMAL_MODEL_DONE.match(line) and model_iterations:
                    finished_halves += 1
                    if finished_halves % 2 == 0 and finished_halves // 2 <= len(model_iterations):
                        bar.update(model_iterations[finished_halves // 2 - 1])
                elif not line.startswith(_EFLOMAL_MESSAGES):
                    terminal.write(line)

    follower = threading.Thread(target=follow, daemon=True)
    follower.start()
    try:
        yield bar
    finally:
        sys.stderr.flush()
        os.dup2(saved_stderr, 2)  # the pipe's last write end closes: the follower reads to its end and stops
        os.close(saved_stderr)
        follower.join()
        bar.close()
        terminal.close()


def _pharaoh_lines(alignments: list[Links]) -> list[str]:
    return [" ".join(f"{i}-{j}" for i, j in links) for links in alignments]


def alignment_priors(source_tokens: list[list[str]], target_tokens: list[list[str]], *, quiet: bool = True,
                     progress: str | None = None, **aligner_options) -> dict:
    """Align a corpus with eflomal once and keep what it learned, for :func:`align_corpus` (``priors=``) to align
    other pairs as if trained on this corpus too: eflomal's priors (lexical translation, HMM jump and fertility
    counts of this run's alignments, as ``eflomal-makepriors`` computes them) over the numbered tokens, and the
    numbering itself. JSON-serialisable (token strings only), so that it can be cached. `quiet` and `progress`
    are :func:`align_corpus`'s.

    Returns:
        ``{"pairs": number of sentence pairs, "source_numbers": {token: number}, "target_numbers": {...},
        "priors": the priors file's text}``.
    """
    try:
        import eflomal
    except ImportError as error:
        raise ImportError("alignment_priors needs the eflomal word aligner: `pip install eflomal`") from error

    if len(source_tokens) != len(target_tokens):
        raise ValueError(
            f"The corpus sides differ in length: {len(source_tokens)} source and {len(target_tokens)} target sentences"
        )
    if not all(isinstance(token, str) for side in (source_tokens, target_tokens) for sentence in side
               for token in sentence):
        raise TypeError("alignment_priors takes string tokens (its numbering must survive a JSON round trip)")
    source_numbers, target_numbers = {}, {}
    source_lines = _eflomal_lines(source_tokens, "source", source_numbers)
    target_lines = _eflomal_lines(target_tokens, "target", target_numbers)
    forward, reverse = _run_eflomal(eflomal.Aligner(**aligner_options), source_lines, target_lines, {"quiet": quiet},
                                    progress)
    counts = eflomal.calculate_priors(source_lines, target_lines, _pharaoh_lines(forward), _pharaoh_lines(reverse))
    text = io.StringIO()
    eflomal.write_priors(text, *counts)
    return {"pairs": len(source_lines), "source_numbers": source_numbers, "target_numbers": target_numbers,
            "priors": text.getvalue()}


# ---------------------------------------------------------------------------------------------------------------
# Fertilities
# ---------------------------------------------------------------------------------------------------------------


def fertilities_from_alignments(
    alignments: Sequence[Sequence[tuple[int, int]]], source_lengths: Sequence[int]
) -> list[list[int]]:
    """Per sentence and source position, the number of distinct target tokens linked to that source token."""
    if len(alignments) != len(source_lengths):
        raise ValueError(f"Got {len(alignments)} alignments but {len(source_lengths)} source lengths")
    fertilities = []
    for k, (links, length) in enumerate(zip(alignments, source_lengths)):
        counts = [0] * length
        for i, j in set((int(i), int(j)) for i, j in links):
            if not 0 <= i < length or j < 0:
                raise ValueError(f"Sentence {k}: link ({i}, {j}) out of range for a {length}-token source")
            counts[i] += 1
        fertilities.append(counts)
    return fertilities


def corpus_token_fertilities(
    tokenizer,
    sources: list[str],
    targets: list[str],
    *,
    max_length: int | None = None,
    **align_options,
) -> tuple[list[list[int]], list[list[int]]]:
    """Tokenize a parallel corpus as the model sees it, align the subword tokens and count source fertilities.

    The source side is ``tokenizer(sources)["input_ids"]`` and the target side
    ``tokenizer(text_target=targets)["input_ids"]`` (the labels), ``</s>`` included on both sides; token ids are
    the aligner's words.

    Args:
        tokenizer: The model's Hugging Face tokenizer.
        sources: Source sentences.
        targets: Their translations.
        max_length: If given, both sides are truncated to it, as with ``truncation=True, max_length=...`` in training.
        **align_options: Passed to :func:`align_corpus` (``seed``, ``symmetrization``, eflomal options).

    Returns:
        ``(source_ids, fertilities)``: per sentence the source token ids and, per token, the number of target
        tokens aligned to it.
    """
    if len(sources) != len(targets):
        raise ValueError(f"Got {len(sources)} source but {len(targets)} target sentences")
    truncation = {} if max_length is None else {"truncation": True, "max_length": max_length}
    source_ids = [list(ids) for ids in tokenizer(list(sources), **truncation)["input_ids"]]
    target_ids = [list(ids) for ids in tokenizer(text_target=list(targets), **truncation)["input_ids"]]
    alignments = align_corpus(source_ids, target_ids, **align_options)
    return source_ids, fertilities_from_alignments(alignments, [len(ids) for ids in source_ids])


def _check_fertility_corpus(source_ids: Sequence[Sequence[int]], fertilities: Sequence[Sequence[int]]) -> None:
    if len(source_ids) != len(fertilities):
        raise ValueError(f"Got {len(source_ids)} source sentences but {len(fertilities)} fertility lists")
    for k, (ids, ferts) in enumerate(zip(source_ids, fertilities)):
        if len(ids) != len(ferts):
            raise ValueError(f"Sentence {k} has {len(ids)} tokens but {len(ferts)} fertilities")
        if any(f < 0 for f in ferts):
            raise ValueError(f"Sentence {k} has a negative fertility: {list(ferts)}")


def guided_fertility_table(
    source_ids: Sequence[Sequence[int]], fertilities: Sequence[Sequence[int]], vocab_size: int
) -> torch.Tensor:
    """The GUIDED fertility of every token id: its largest observed fertility, or 1 (Section 4).

    The paper sets each word's fertility "to the maximal observed value in the training data (or 1 if no
    alignment was observed)". "Observed" means an alignment link: a token id that never occurs, and one that
    occurs but was never linked to any target token (fertility 0 everywhere), both get 1 -- never 0, which would
    forbid any attention to the token. Hence every entry is ``max(1, largest fertility of the id)``.

    Returns:
        A float32 tensor ``[vocab_size]``, to pass as ``guided_table`` to
        ``hf_headattn.runtime.fertility.source_fertility`` (or to load into the model's ``guided_fertility`` buffer).
    """
    _check_fertility_corpus(source_ids, fertilities)
    ids = torch.tensor([int(i) for sentence in source_ids for i in sentence], dtype=torch.long)
    values = torch.tensor([float(f) for sentence in fertilities for f in sentence], dtype=torch.float32)
    if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= vocab_size):
        raise ValueError(f"Token ids must lie in [0, {vocab_size}), got ids in [{int(ids.min())}, {int(ids.max())}]")
    table = torch.ones(vocab_size, dtype=torch.float32)
    return table.scatter_reduce(0, ids, values, reduce="amax", include_self=True)


def train_fertility_predictor(
    predictor: FertilityPredictor,
    source_ids: Sequence[Sequence[int]],
    fertilities: Sequence[Sequence[int]],
    *,
    epochs: int = 5,
    batch_size: int = 32,
    learning_rate: float = 1e-3,
    slack: int = 1,
    seed: int = 0,
    progress: bool = True,
) -> list[float]:
    """Train the PREDICTED strategy's bi-LSTM tagger on aligner fertilities (Section 4).

    The supervision of a token is ``min(fertility + slack, predictor.max_fertility)``: the paper adds 1 "since
    our model works with fertility upper bounds and the word aligner may miss some word pairs". The loss is the
    cross-entropy over the fertility classes, averaged over real tokens (padding is ignored); the optimizer is
    Adam. Batches are drawn in an order fixed by ``seed``. The predictor is left in the train/eval mode it had.

    Returns:
        The mean loss per token of every epoch.
    """
    _check_fertility_corpus(source_ids, fertilities)
    for name, value in (("epochs", epochs), ("batch_size", batch_size)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive int, got {value!r}")
    if isinstance(slack, bool) or not isinstance(slack, int) or slack < 0:
        raise ValueError(f"slack must be an int >= 0, got {slack!r}")

    pad_id = predictor.pad_token_id if predictor.pad_token_id is not None else 0
    examples = [
        (list(ids), [min(int(f) + slack, predictor.max_fertility) for f in ferts])
        for ids, ferts in zip(source_ids, fertilities)
        if len(ids) > 0
    ]
    if not examples:
        raise ValueError("No non-empty source sentence to train the fertility predictor on")
    device = next(predictor.parameters()).device
    optimizer = torch.optim.Adam(predictor.parameters(), lr=learning_rate)
    generator = torch.Generator().manual_seed(seed)
    n_batches = (len(examples) + batch_size - 1) // batch_size
    was_training = predictor.training
    predictor.train()

    epoch_losses = []
    with tqdm(total=epochs * n_batches, desc="Fertility predictor", disable=not progress) as bar:
        for epoch in range(epochs):
            order = torch.randperm(len(examples), generator=generator).tolist()
            loss_sum, token_count = 0.0, 0
            for start in range(0, len(examples), batch_size):
                batch = [examples[k] for k in order[start : start + batch_size]]
                width = max(len(ids) for ids, _ in batch)
                input_ids = torch.full((len(batch), width), pad_id, dtype=torch.long)
                labels = torch.full((len(batch), width), -100, dtype=torch.long)
                for row, (ids, targets) in enumerate(batch):
                    input_ids[row, : len(ids)] = torch.tensor(ids)
                    labels[row, : len(ids)] = torch.tensor(targets)
                input_ids, labels = input_ids.to(device), labels.to(device)
                attention_mask = labels != -100

                logits = predictor(input_ids, attention_mask=attention_mask)
                n_tokens = int(attention_mask.sum())
                loss = F.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=-100, reduction="sum")
                optimizer.zero_grad()
                (loss / n_tokens).backward()
                optimizer.step()

                loss_sum += float(loss.detach())
                token_count += n_tokens
                bar.update(1)
                bar.set_postfix(epoch=epoch + 1, loss=f"{loss_sum / token_count:.4f}")
            epoch_losses.append(loss_sum / token_count)

    predictor.train(was_training)
    return epoch_losses
