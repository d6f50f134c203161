"""Corpus BLEU per source-length bucket (Cui et al., 2019, Fig. 2; Iida et al., 2019, Table 3).

Tooling, not model runtime: never copied into a checkpoint.
"""

from __future__ import annotations

from collections.abc import Sequence

from .texts import check_parallel


DEFAULT_LENGTH_BUCKETS = (10, 20, 30, 40, 50)


def check_length_buckets(buckets: Sequence[int]) -> tuple[int, ...]:
    """The boundaries as a tuple; ValueError (TypeError for a string) unless positive, strictly increasing ints."""
    if isinstance(buckets, (str, bytes)):
        raise TypeError("buckets must be a sequence of ints")
    buckets = tuple(buckets)
    if not buckets:
        raise ValueError("buckets must contain at least one boundary")
    for b in buckets:
        if isinstance(b, bool) or not isinstance(b, int) or b < 1:
            raise ValueError(f"Bucket boundaries must be positive ints, got {b!r}")
    if any(a >= b for a, b in zip(buckets, buckets[1:])):
        raise ValueError(f"Bucket boundaries must be strictly increasing, got {buckets}")
    return buckets


def length_bucket_labels(buckets: Sequence[int] = DEFAULT_LENGTH_BUCKETS) -> list[str]:
    """Labels of the ``len(buckets) + 1`` buckets: ``"<b0"``, ``"b0-(b1-1)"``, ..., ``">=b_last"``.

    The default ``(10, 20, 30, 40, 50)`` gives ``["<10", "10-19", "20-29", "30-39", "40-49", ">=50"]``; a bucket
    whose range holds one length is labelled by that length alone (``(10, 11)`` gives ``"10"``).
    """
    buckets = check_length_buckets(buckets)
    labels = [f"<{buckets[0]}"]
    for low, high in zip(buckets, buckets[1:]):
        labels.append(f"{low}" if high - 1 == low else f"{low}-{high - 1}")
    labels.append(f">={buckets[-1]}")
    return labels


def length_bucket(n_words: int, buckets: Sequence[int] = DEFAULT_LENGTH_BUCKETS) -> int:
    """Index of the bucket of a sentence with ``n_words`` words: the first i with ``n_words < buckets[i]``, else
    ``len(buckets)`` (the open last bucket)."""
    buckets = check_length_buckets(buckets)
    for index, bound in enumerate(buckets):
        if n_words < bound:
            return index
    return len(buckets)


def bleu_by_length(
    sources: Sequence[str],
    hypotheses: Sequence[str],
    references: Sequence[str],
    buckets: Sequence[int] = DEFAULT_LENGTH_BUCKETS,
) -> dict[str, dict[str, float | int | None]]:
    """Corpus BLEU per source-length bucket (Cui et al. 2019, MMA, Fig. 2; Iida et al. 2019, Table 3).

    A sentence's length is the number of whitespace words of its *source* (``len(source.split())``). With
    boundaries ``b0 < b1 < ... < bm`` the buckets are ``[0, b0)``, ``[b0, b1)``, ..., ``[bm, inf)``, labelled
    ``"<b0"``, ``"b0-(b1-1)"``, ..., ``">=bm"`` (:func:`length_bucket_labels`); the default gives ``"<10"``,
    ``"10-19"``, ``"20-29"``, ``"30-39"``, ``"40-49"``, ``">=50"``, the 0-9, 10-19, ... grouping of Iida et al.
    The MMA paper's right-closed groups (0, 10], (10, 20], ... are ``buckets=(11, 21, 31, 41, 51)``.

    Each bucket is scored as its own corpus with ``sacrebleu.corpus_bleu`` (default settings), so the bucket
    scores do not average to the overall BLEU.

    Returns:
        ``{label: {"count": number of sentences, "bleu": corpus BLEU or None if the bucket is empty}}`` for every
        bucket, in increasing length order.
    """
    sources, hypotheses, references = check_parallel(sources=sources, hypotheses=hypotheses, references=references)
    import sacrebleu

    buckets = check_length_buckets(buckets)
    labels = length_bucket_labels(buckets)
    members: list[list[int]] = [[] for _ in labels]
    for k, source in enumerate(sources):
        members[length_bucket(len(source.split()), buckets)].append(k)
    result = {}
    for label, indices in zip(labels, members):
        bleu = None
        if indices:
            # force=True: the same score, without sacrebleu's "forgot to detokenize" warning on tokenised text
            bleu = sacrebleu.corpus_bleu([hypotheses[k] for k in indices], [[references[k] for k in indices]],
                                         force=True).score
        result[label] = {"count": len(indices), "bleu": bleu}
    return result
