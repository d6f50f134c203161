"""Fertilities from word alignments, for the GUIDED and PREDICTED fertility bounds (Malaviya et al., 2018, Sec. 4):
per source token the number of target tokens linked to it, the GUIDED table of every token id's largest one, and
the PREDICTED bi-LSTM tagger trained on them.

Tooling, not model runtime: never copied into a checkpoint.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch.nn import functional as F

from ..progress import Progress
from ..runtime.fertility import FertilityPredictor


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
    from . import align_corpus  # the package's name, looked up now: what a test replaces there is what runs

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
    with Progress(total=epochs * n_batches, desc="Fertility predictor", unit="batch", disable=not progress) as bar:
        for epoch in range(epochs):
            order = torch.randperm(len(examples), generator=generator).tolist()
            loss_sum, token_count = 0.0, 0
            for start in range(0, len(examples), batch_size):
                batch = [examples[k] for k in order[start : start + batch_size]]
                input_ids, labels = (tensor.to(device) for tensor in _padded_batch(batch, pad_id))
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
                bar.set_postfix(epoch=epoch + 1, loss=f"{loss_sum / token_count:.4f}", refresh=False)
            epoch_losses.append(loss_sum / token_count)

    predictor.train(was_training)
    return epoch_losses


def _padded_batch(batch: list[tuple[list[int], list[int]]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(input ids padded with `pad_id`, labels padded with -100, the ignored index) of (ids, labels) pairs."""
    width = max(len(ids) for ids, _ in batch)
    input_ids = torch.full((len(batch), width), pad_id, dtype=torch.long)
    labels = torch.full((len(batch), width), -100, dtype=torch.long)
    for row, (ids, targets) in enumerate(batch):
        input_ids[row, : len(ids)] = torch.tensor(ids)
        labels[row, : len(ids)] = torch.tensor(targets)
    return input_ids, labels
