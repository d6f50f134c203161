"""Translation metrics: corpus BLEU/chrF/TER (sacrebleu), REP and DROP (Malaviya et al., 2018), BLEU by length.

All functions take plain lists of strings, one per sentence, and a single reference per sentence.

* :func:`corpus_scores`: sacrebleu's corpus BLEU, chrF and TER with sacrebleu's default settings (BLEU with the
  ``13a`` tokenizer, chrF with ``char_order=6, word_order=0, beta=2``, TER ignoring case, sacrebleu's default).
* :func:`rep_score`: the REP-score of Malaviya et al. (2018, Sec. 5), counting repeated n-grams of the output.
* :func:`drop_score`: the DROP-score of the same paper, the percentage of source words that are aligned to the
  reference but not to the output; the alignments come from eflomal (:func:`hf_headattn.alignment.align_corpus`).
  eflomal samples (it cannot be seeded), so DROP pools several alignment runs and reports their spread, and the
  aligner's training and the alignments are cached: the same inputs give the same score (:func:`align_for_drop`).
* :func:`bleu_by_length`: corpus BLEU per source-length bucket (Cui et al., 2019, Mixed Multi-Head
  Self-Attention, Fig. 2; Iida et al., 2019, A Multi-Hop Attention for RNN based NMT, Table 3).
* :func:`all_metrics`: all of the above in one dict.
* :func:`paired_bootstrap_p`: sacrebleu's paired bootstrap test for any corpus score computed from per-sentence
  statistics, such as REP (:func:`rep_sentence_counts`) and DROP (``sentence_counts`` of :func:`drop_details`).

REP and DROP follow the authors' evaluation scripts (``coverage-eval/rep_score.py`` and ``drop_score.py`` in
github.com/Unbabel/sparse_constrained_attention); the docstrings give the exact definitions and the few points
where this implementation deliberately differs (the corner cases the scripts crash on or mishandle).

**Tokenisation for REP and DROP.** The authors ran both scripts on Moses-tokenized, BPE-merged text and split it
on whitespace. Here the words are ``text.split()`` of the text as passed (``tokenize="whitespace"``, the default):
for detokenised model output such as "the dog." that makes "dog." one word, exactly as the scripts would on that
text. ``tokenize="13a"`` first applies sacrebleu's 13a tokenizer (mteval-v13a, which splits off punctuation much
like the Moses tokenizer the authors used), and any callable ``str -> list[str]`` is accepted as well. The same
tokenisation is applied to sources, hypotheses and references (and to the aligner's training corpus). Neither
metric lowercases.

REP, DROP and BLEU by length can also be loaded as Hugging Face ``evaluate`` modules shipped with the package
(:func:`load_metric`, e.g. ``load_metric("rep")``, or ``evaluate.load`` of the folder), since the Hub's metric
scripts are unreachable offline. Corpus BLEU/chrF/TER have no module of their own here: use :func:`corpus_scores`.

One module a metric: `scores` (BLEU, chrF, TER), `rep`, `drop`, `bleu_by_length`, `significance` (the paired
bootstrap), `texts` (input checks, tokenisation); this package's namespace holds them all, `all_metrics` and the
`evaluate` modules' loader.

Tooling, not model runtime: never copied into a checkpoint.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from .bleu_by_length import (DEFAULT_LENGTH_BUCKETS, bleu_by_length, check_length_buckets, length_bucket,
                             length_bucket_labels)
from .drop import (DROP_ALIGNMENT_RUNS, align_for_drop, default_cache_dir, drop_alignment_runs, drop_counts,
                   drop_details, drop_score)
from .rep import rep_score, rep_sentence_counts, rep_sentence_score
from .scores import corpus_scores, score_translations
from .significance import paired_bootstrap_p, ratio_score
from .texts import Tokenizer, check_parallel, get_tokenizer

__all__ = [
    "DEFAULT_LENGTH_BUCKETS",
    "METRIC_MODULES",
    "METRIC_MODULES_DIR",
    "DROP_ALIGNMENT_RUNS",
    "align_for_drop",
    "default_cache_dir",
    "drop_alignment_runs",
    "all_metrics",
    "bleu_by_length",
    "check_length_buckets",
    "corpus_scores",
    "score_translations",
    "drop_counts",
    "drop_details",
    "drop_score",
    "length_bucket",
    "length_bucket_labels",
    "load_metric",
    "metric_path",
    "paired_bootstrap_p",
    "ratio_score",
    "rep_score",
    "rep_sentence_counts",
    "rep_sentence_score",
]

METRIC_MODULES_DIR = Path(__file__).resolve().parent.parent / "evaluate_modules"
METRIC_MODULES = ("rep", "drop", "bleu_by_length")


def all_metrics(
    sources: Sequence[str],
    hypotheses: Sequence[str],
    references: Sequence[str],
    *,
    train_sources: Sequence[str] | None = None,
    train_targets: Sequence[str] | None = None,
    alignments: tuple[Sequence, Sequence] | Mapping[str, Sequence] | None = None,
    buckets: Sequence[int] = DEFAULT_LENGTH_BUCKETS,
    tokenize: str | Tokenizer = "whitespace",
    **align_options,
) -> dict:
    """All metrics in one dict: ``bleu``, ``chrf``, ``ter``, ``rep``, ``drop`` and ``bleu_by_length``.

    ``drop`` is only computed, and only present, when the aligner's training corpus (``train_sources`` and
    ``train_targets``) or precomputed ``alignments`` are given (see :func:`drop_score`); then ``drop_alignment``
    says how it was aligned: ``drop_runs`` (DROP of each alignment run), ``drop_std`` and what
    :func:`drop_alignment_runs` reports (``runs``, aligner trained or read from the cache, ...; only the first two
    for precomputed alignments). ``rep`` is None when the
    references contain no word. ``tokenize`` applies to REP and DROP; ``buckets`` to :func:`bleu_by_length`.
    """
    sources, hypotheses, references = check_parallel(sources=sources, hypotheses=hypotheses, references=references)
    result: dict = dict(corpus_scores(hypotheses, references))
    split = get_tokenizer(tokenize)
    result["rep"] = rep_score(hypotheses, references, tokenize=split) if any(split(r) for r in references) else None
    if alignments is not None or train_sources is not None or train_targets is not None:
        details = drop_details(
            sources,
            hypotheses,
            references,
            train_sources=train_sources,
            train_targets=train_targets,
            alignments=alignments,
            tokenize=split,
            **align_options,
        )
        result["drop"] = details["drop"]
        result["drop_alignment"] = {"drop_runs": details["drop_runs"], "drop_std": details["drop_std"],
                                    **(details["alignment"] or {})}
    result["bleu_by_length"] = bleu_by_length(sources, hypotheses, references, buckets=buckets)
    return result


def metric_path(name: str) -> str:
    """Folder of the shipped ``evaluate`` module ``name`` (one of :data:`METRIC_MODULES`)."""
    if name not in METRIC_MODULES:
        raise ValueError(f"Unknown metric module {name!r}; shipped: {', '.join(METRIC_MODULES)}")
    return str(METRIC_MODULES_DIR / name)


def load_metric(name: str, **kwargs):
    """``evaluate.load`` of a metric module shipped with the package: ``"rep"``, ``"drop"`` or ``"bleu_by_length"``.

    Equivalent to ``evaluate.load(metric_path(name), **kwargs)``; works offline. evaluate copies the script into
    its modules cache and imports it from there, which is why the scripts import ``hf_headattn.metrics``
    absolutely (the package must be installed).
    """
    import evaluate

    return evaluate.load(metric_path(name), **kwargs)
