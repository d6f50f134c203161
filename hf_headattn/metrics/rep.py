"""REP (Malaviya et al., 2018, Sec. 5): repeated n-grams of the output beyond the reference's, as in the authors'
coverage-eval/rep_score.py.

Tooling, not model runtime: never copied into a checkpoint.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from .texts import Tokenizer, check_parallel, get_tokenizer


def _ngrams(words: Sequence[str], n: int) -> Counter:
    return Counter(tuple(words[i : i + n]) for i in range(len(words) - n + 1))


def rep_sentence_score(
    hypothesis_words: Sequence[str],
    reference_words: Sequence[str],
    *,
    n: int = 2,
    lambda1: float = 1.0,
    lambda2: float = 2.0,
) -> float:
    """Sentence-level repetition penalty sigma(t, r) of Malaviya et al. (2018, Sec. 5), on tokenized words.

    With t(s) and r(s) the counts of the n-gram s in the output and in the reference::

        sigma = lambda1 * sum over n-grams s with t(s) >= 2 of max(0, t(s) - r(s))
              + lambda2 * sum over words w                  of max(0, t(ww) - r(ww))

    The first term penalises every n-gram the output contains *more than once*, by how often it occurs beyond
    its count in the reference (its full count if the reference lacks it). The second term looks at the bigrams
    made of one word twice, ``(w, w)``, at *any* count: a single "the the" already costs ``lambda2`` if the
    reference has no "the the". A ``(w, w)`` bigram that occurs twice or more is counted by both terms (with
    n = 2), so "dog dog dog" against a reference without "dog dog" scores 1 * 2 + 2 * 2 = 6. The second term
    always uses bigrams, whatever ``n``; the paper and the authors' defaults are n = 2, lambda1 = 1, lambda2 = 2.

    This is exactly what ``rep_score.py`` of the authors computes per line.
    """
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"n must be a positive int, got {n!r}")
    output, reference = _ngrams(hypothesis_words, n), _ngrams(reference_words, n)
    repeated = sum(max(0, count - reference[ngram]) for ngram, count in output.items() if count >= 2)
    output_bigrams = output if n == 2 else _ngrams(hypothesis_words, 2)
    reference_bigrams = reference if n == 2 else _ngrams(reference_words, 2)
    doubled = sum(
        max(0, count - reference_bigrams[bigram]) for bigram, count in output_bigrams.items() if bigram[0] == bigram[1]
    )
    return lambda1 * repeated + lambda2 * doubled


def rep_sentence_counts(
    hypotheses: Sequence[str],
    references: Sequence[str],
    *,
    n: int = 2,
    lambda1: float = 1.0,
    lambda2: float = 2.0,
    tokenize: str | Tokenizer = "whitespace",
) -> list[tuple[float, int]]:
    """Per sentence k, ``(sigma_k, number of reference words)``: the statistics :func:`rep_score` sums (and
    :func:`paired_bootstrap_p` resamples). Arguments as for :func:`rep_score`."""
    hypotheses, references = check_parallel(hypotheses=hypotheses, references=references)
    split = get_tokenizer(tokenize)
    counts = []
    for hypothesis, reference in zip(hypotheses, references):
        reference_words = split(reference)
        sigma = rep_sentence_score(split(hypothesis), reference_words, n=n, lambda1=lambda1, lambda2=lambda2)
        counts.append((sigma, len(reference_words)))
    return counts


def rep_score(
    hypotheses: Sequence[str],
    references: Sequence[str],
    *,
    n: int = 2,
    lambda1: float = 1.0,
    lambda2: float = 2.0,
    tokenize: str | Tokenizer = "whitespace",
) -> float:
    """REP-score (Malaviya et al., 2018, Sec. 5): ``100 * sum_k sigma_k / (number of reference words)``.

    ``sigma_k`` is :func:`rep_sentence_score` of sentence k (with the paper's n = 2, lambda1 = 1, lambda2 = 2 by
    default) and the denominator is the total number of words of all references, as in the authors'
    ``rep_score.py --normalize``. Lower is better; a translation equal to its reference scores 0.

    Words are ``text.split()`` by default (see the module docstring for ``tokenize``). An empty hypothesis has no
    n-grams and adds 0.

    Raises:
        ValueError: for mismatched or empty lists, or if the references contain no word at all (the score is
            undefined; the authors' script stops with "The reference file is empty.").
    """
    counts = rep_sentence_counts(hypotheses, references, n=n, lambda1=lambda1, lambda2=lambda2, tokenize=tokenize)
    reference_words = sum(words for _, words in counts)
    if reference_words == 0:
        raise ValueError("REP is normalised by the number of reference words, and the references contain none")
    return 100.0 * sum(sigma for sigma, _ in counts) / reference_words
