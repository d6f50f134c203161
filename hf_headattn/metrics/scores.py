"""Corpus BLEU, chrF and TER with sacrebleu's default settings.

Tooling, not model runtime: never copied into a checkpoint.
"""

from __future__ import annotations

from collections.abc import Sequence

from .texts import check_parallel


def score_translations(hypotheses: Sequence[str], references: Sequence[str]) -> dict[str, float]:
    """Corpus BLEU and chrF with sacrebleu's default settings, as the training command reports them. `force=True`
    only silences sacrebleu's "forgot to detokenize" warning (same score, same signature), which the toy corpus
    (tokenised text) sets off."""
    import sacrebleu

    return {
        "bleu": sacrebleu.corpus_bleu(list(hypotheses), [list(references)], force=True).score,
        "chrf": sacrebleu.corpus_chrf(list(hypotheses), [list(references)]).score,
    }


def corpus_scores(hypotheses: Sequence[str], references: Sequence[str]) -> dict[str, float]:
    """Corpus BLEU, chrF and TER with sacrebleu's default settings (one reference per sentence).

    Returns ``{"bleu": ..., "chrf": ..., "ter": ...}``, the ``.score`` of ``sacrebleu.corpus_bleu``,
    ``corpus_chrf`` and ``corpus_ter`` (all on a 0-100 scale; lower TER is better).
    """
    import sacrebleu

    hypotheses, references = check_parallel(hypotheses=hypotheses, references=references)
    return {
        **score_translations(hypotheses, references),
        "ter": sacrebleu.corpus_ter(hypotheses, [references]).score,
    }
