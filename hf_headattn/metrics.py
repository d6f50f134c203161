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

This module is tooling: it is not copied into saved checkpoints.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import statistics
import warnings
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import numpy as np

logger = logging.getLogger(__name__)

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

DEFAULT_LENGTH_BUCKETS = (10, 20, 30, 40, 50)

# eflomal draws its random state from /dev/urandom, and one run's DROP can move by a few points on a test set of
# 1,000 sentences (33.54 vs 33.87 and 29.21 vs 26.08 on two calls): DROP pools this many runs and reports the spread.
DROP_ALIGNMENT_RUNS = 5
_DROP_CACHE_VERSION = 1  # bump when what is cached, or how, changes

METRIC_MODULES_DIR = Path(__file__).resolve().with_name("evaluate_modules")
METRIC_MODULES = ("rep", "drop", "bleu_by_length")

Tokenizer = Callable[[str], list[str]]
Links = list[tuple[int, int]]


# ---------------------------------------------------------------------------------------------------------------
# Input checks and tokenisation
# ---------------------------------------------------------------------------------------------------------------


def _check_texts(name: str, texts) -> list[str]:
    if isinstance(texts, (str, bytes)):
        raise TypeError(f"{name} must be a list of sentences (one string each), not a single string")
    texts = list(texts)
    for k, text in enumerate(texts):
        if not isinstance(text, str):
            hint = " (one reference per sentence is supported)" if isinstance(text, (list, tuple)) else ""
            raise TypeError(f"{name}[{k}] must be a string, got {type(text).__name__}{hint}")
    return texts


def _check_parallel(**named) -> list[list[str]]:
    """Check that every argument is a non-empty list of strings and that all have the same length."""
    checked = {name: _check_texts(name, texts) for name, texts in named.items()}
    lengths = {name: len(texts) for name, texts in checked.items()}
    if len(set(lengths.values())) > 1:
        raise ValueError(
            "Mismatched numbers of sentences: " + ", ".join(f"{len_} {name}" for name, len_ in lengths.items())
        )
    if next(iter(lengths.values())) == 0:
        raise ValueError(f"Empty input: {', '.join(lengths)} contain no sentences")
    return list(checked.values())


def _named(name: str, tokenizer: Tokenizer) -> Tokenizer:
    """Mark a built-in tokenisation with its name: DROP's cache then keys the training corpus by its raw text and
    this name, without tokenizing it (seconds for a large corpus), and `_get_tokenizer` passes it on unwrapped."""
    tokenizer.tokenizer_name = name
    return tokenizer


def _get_tokenizer(tokenize: str | Tokenizer | None) -> Tokenizer:
    if callable(tokenize) and getattr(tokenize, "tokenizer_name", None):
        return tokenize
    if tokenize is None or tokenize == "whitespace":
        return _named("whitespace", lambda text: text.split())
    if tokenize == "13a":
        from sacrebleu.tokenizers.tokenizer_13a import Tokenizer13a

        tokenizer_13a = Tokenizer13a()
        return _named("13a", lambda text: tokenizer_13a(text).split())
    if callable(tokenize):
        def checked(text: str) -> list[str]:
            words = tokenize(text)
            if isinstance(words, str) or not all(isinstance(w, str) for w in words):
                raise TypeError("A custom `tokenize` must return a list of strings")
            return list(words)

        return checked
    raise ValueError(f"Unknown tokenize={tokenize!r}; use 'whitespace', '13a' or a callable str -> list[str]")


# ---------------------------------------------------------------------------------------------------------------
# Corpus BLEU / chrF / TER
# ---------------------------------------------------------------------------------------------------------------


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

    hypotheses, references = _check_parallel(hypotheses=hypotheses, references=references)
    return {
        **score_translations(hypotheses, references),
        "ter": sacrebleu.corpus_ter(hypotheses, [references]).score,
    }


# ---------------------------------------------------------------------------------------------------------------
# REP
# ---------------------------------------------------------------------------------------------------------------


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
    hypotheses, references = _check_parallel(hypotheses=hypotheses, references=references)
    split = _get_tokenizer(tokenize)
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


# ---------------------------------------------------------------------------------------------------------------
# DROP
# ---------------------------------------------------------------------------------------------------------------


def _parse_links(links, k: int, what: str) -> Links:
    if isinstance(links, str):  # Pharaoh / fast_align format: "0-0 1-2"
        try:
            return [tuple(int(x) for x in link.split("-")) for link in links.split()]
        except ValueError as error:
            raise ValueError(f"{what}[{k}]: cannot parse {links!r} as 'i-j i-j ...' links") from error
    parsed = []
    for link in links:
        if len(link) != 2:
            raise ValueError(f"{what}[{k}]: a link must be a (source index, target index) pair, got {link!r}")
        parsed.append((int(link[0]), int(link[1])))
    return parsed


def _check_alignments(
    alignments, what: str, source_lengths: Sequence[int] | None, target_lengths: Sequence[int] | None
) -> list[Links]:
    if isinstance(alignments, (str, bytes)) or not isinstance(alignments, Sequence):
        raise TypeError(f"{what} must be a list with one list of (i, j) links (or one 'i-j ...' string) per sentence")
    checked = []
    for k, links in enumerate(alignments):
        links = _parse_links(links, k, what)
        for i, j in links:
            if i < 0 or j < 0 or (source_lengths is not None and i >= source_lengths[k]) or (
                target_lengths is not None and j >= target_lengths[k]
            ):
                sizes = "" if source_lengths is None else f" for a {source_lengths[k]}-word source"
                sizes += "" if target_lengths is None else f" and a {target_lengths[k]}-word target"
                raise ValueError(f"{what}[{k}]: link ({i}, {j}) out of range{sizes}")
        checked.append(links)
    return checked


def drop_counts(
    reference_alignments: Sequence,
    hypothesis_alignments: Sequence,
    *,
    source_lengths: Sequence[int] | None = None,
    reference_lengths: Sequence[int] | None = None,
    hypothesis_lengths: Sequence[int] | None = None,
) -> tuple[int, int]:
    """Count, from source-reference and source-hypothesis alignments, the dropped and the reference-aligned words.

    Per sentence k, with ``R_k`` the set of source positions linked to at least one reference word and ``H_k``
    the set of source positions linked to at least one hypothesis word::

        dropped = sum_k |R_k - H_k|        aligned = sum_k |R_k|

    and DROP = ``100 * dropped / aligned`` (:func:`drop_score`). Each alignment is a list of ``(source index,
    target index)`` links, or a Pharaoh string ``"0-0 1-2"``; an empty list (or ``""``) means no links: such a
    sentence adds nothing to ``aligned`` if it is the reference alignment, and all of ``R_k`` to ``dropped`` if it
    is the hypothesis alignment. Duplicate links and several links of one source word count once. The lengths,
    when given, are used to reject out-of-range links.

    Returns:
        ``(dropped, aligned)``.
    """
    if len(reference_alignments) != len(hypothesis_alignments):
        raise ValueError(
            f"Mismatched alignments: {len(reference_alignments)} source-reference and {len(hypothesis_alignments)} "
            "source-hypothesis sentences"
        )
    reference_links = _check_alignments(reference_alignments, "reference_alignments", source_lengths, reference_lengths)
    hypothesis_links = _check_alignments(
        hypothesis_alignments, "hypothesis_alignments", source_lengths, hypothesis_lengths
    )
    counts = _drop_sentence_counts(reference_links, hypothesis_links)
    return sum(dropped for dropped, _ in counts), sum(aligned for _, aligned in counts)


def _drop_sentence_counts(reference_links: list[Links], hypothesis_links: list[Links]) -> list[tuple[int, int]]:
    """Per sentence k, ``(|R_k - H_k|, |R_k|)`` (see :func:`drop_counts`)."""
    counts = []
    for ref_links, hyp_links in zip(reference_links, hypothesis_links):
        reference_aligned = {i for i, _ in ref_links}
        hypothesis_aligned = {i for i, _ in hyp_links}
        counts.append((len(reference_aligned - hypothesis_aligned), len(reference_aligned)))
    return counts


def default_cache_dir() -> Path:
    """Where DROP keeps its trained aligners and alignments: ``$HF_HEADATTN_CACHE/drop``, by default
    ``~/.cache/hf_headattn/drop``. Entries are named by a hash of everything they depend on, so a stale entry is
    never read; delete the folder to reclaim the space."""
    root = os.environ.get("HF_HEADATTN_CACHE") or Path.home() / ".cache" / "hf_headattn"
    return Path(root) / "drop"


def _digest(*parts) -> str:
    # (default=repr: an option value JSON cannot hold still keys the entry by its repr)
    text = json.dumps(parts, ensure_ascii=False, sort_keys=True, default=repr)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:32]


def _cached(path: Path | None, compute, valid):
    """(the JSON value stored at `path`, True), or (compute(), False) after storing it there (atomically, so that a
    concurrent or interrupted run never leaves half a file); no cache if `path` is None. A stored value that is not
    JSON or fails `valid` (a damaged or edited file) is logged and computed again."""
    if path is not None and path.is_file():
        try:
            value = json.loads(path.read_text(encoding="utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError):
            value = None
        if value is not None and valid(value):
            return value, True
        logger.warning(f"{path}: damaged DROP cache entry; computing it again")
    value = compute()
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        temporary = path.with_name(f"{path.name}.{os.getpid()}.tmp")
        temporary.write_text(json.dumps(value, ensure_ascii=False), encoding="utf-8")
        os.replace(temporary, path)
    return value, False


def _valid_priors(value) -> bool:
    """What `alignment.alignment_priors` returns, as JSON holds it."""
    return (isinstance(value, dict) and isinstance(value.get("priors"), str) and isinstance(value.get("pairs"), int)
            and all(isinstance(value.get(key), dict) for key in ("source_numbers", "target_numbers")))


def _valid_alignments(value, runs: int, lengths: list[tuple[int, int, int]]) -> bool:
    """`runs` alignments of every test pair, (source, reference) then (source, hypothesis) links, each link a pair
    of word positions inside its sentences."""
    def valid_side(side, target: int) -> bool:
        return isinstance(side, list) and len(side) == len(lengths) and all(
            isinstance(links, list) and all(
                isinstance(link, list) and len(link) == 2 and all(isinstance(index, int) for index in link)
                and 0 <= link[0] < sentence[0] and 0 <= link[1] < sentence[target] for link in links)
            for links, sentence in zip(side, lengths))

    return isinstance(value, list) and len(value) == runs and all(
        isinstance(run, list) and len(run) == 2 and valid_side(run[0], 1) and valid_side(run[1], 2) for run in value)


# Options of align_corpus itself; the others are eflomal's (they shape the aligner trained on the corpus too).
_ALIGN_CORPUS_OPTIONS = ("seed", "symmetrization", "quiet")


def drop_alignment_runs(
    sources: Sequence[str],
    hypotheses: Sequence[str],
    references: Sequence[str],
    *,
    train_sources: Sequence[str] | None = None,
    train_targets: Sequence[str] | None = None,
    tokenize: str | Tokenizer = "whitespace",
    runs: int = DROP_ALIGNMENT_RUNS,
    cache: bool = True,
    cache_dir: str | Path | None = None,
    **align_options,
) -> tuple[list[tuple[list[Links], list[Links]]], dict]:
    """`runs` independent eflomal alignments of the test sources to their references and to the hypotheses.

    The aligner is trained once on the training corpus (:func:`hf_headattn.alignment.alignment_priors`: eflomal
    on the corpus, keeping its learned counts as priors), then each run aligns the test pairs::

        (sources, references)  +  (sources, hypotheses)

    with those priors, i.e. as if trained on the corpus too, and the links of the two portions are read out. The
    authors trained fast_align on the training corpus and force-aligned the test pairs with the trained parameters
    (``force_align.py``); eflomal's priors are its way of aligning new pairs with what a corpus taught it. Both
    directions are symmetrized with grow-diag-final-and, like ``force_align.py`` (``symmetrization=`` changes it).
    Without a training corpus only the test pairs are aligned, with a warning: a few hundred sentences give poor
    alignments.

    eflomal's Gibbs sampler cannot be seeded, so runs differ: :func:`drop_details` pools them and reports their
    spread. Both steps are cached under `cache_dir` (default :func:`default_cache_dir`) in JSON files named by a
    hash of their inputs (the tokenized corpus, the test pairs, `runs`, the options): the aligner of a training
    corpus is trained once and reused for every later call on that corpus (the minutes a large corpus takes), and a
    call with the same inputs reads the same alignments back, so it gives the same score.

    Args:
        sources, hypotheses, references: The test set, one string per sentence.
        train_sources, train_targets: The training corpus of the aligner (both or neither).
        tokenize: Word tokenisation of every side (module docstring).
        runs: Independent alignment runs.
        cache: Read and write the cache (False: align afresh, store nothing).
        cache_dir: The cache folder.
        **align_options: ``seed``, ``symmetrization``, ``quiet`` for :func:`hf_headattn.alignment.align_corpus`;
            the rest are eflomal options (``model``, ``n_iterations``, ...), used for training and aligning.

    Returns:
        ``(per run (reference_alignments, hypothesis_alignments), how)``: the alignments per test sentence as
        ``(source word, target word)`` links, and ``how`` = ``{"runs", "aligner" ("trained", "cached" or None
        without a training corpus), "aligner_training_pairs", "alignments" ("aligned" or "cached"),
        "cache_dir"}``.
    """
    sources, hypotheses, references = _check_parallel(sources=sources, hypotheses=hypotheses, references=references)
    if (train_sources is None) != (train_targets is None):
        raise ValueError("Pass both train_sources and train_targets (the aligner's training corpus), or neither")
    if isinstance(runs, bool) or not isinstance(runs, int) or runs < 1:
        raise ValueError(f"`runs` (eflomal alignment runs) must be a positive integer, got {runs!r}")
    if train_sources is None:
        warnings.warn(
            "No training corpus for the DROP aligner: eflomal is trained on the test pairs alone, which gives "
            "poor alignments on small test sets; pass train_sources/train_targets",
            stacklevel=2,
        )
        train_sources, train_targets = [], []
    train_sources = _check_texts("train_sources", train_sources)
    train_targets = _check_texts("train_targets", train_targets)
    if len(train_sources) != len(train_targets):
        raise ValueError(
            f"Mismatched training corpus: {len(train_sources)} train_sources and {len(train_targets)} train_targets"
        )

    from .alignment import align_corpus, alignment_priors

    split = _get_tokenizer(tokenize)
    source_words, reference_words = [split(s) for s in sources], [split(r) for r in references]
    hypothesis_words = [split(h) for h in hypotheses]
    directory = None if not cache else Path(cache_dir) if cache_dir is not None else default_cache_dir()
    eflomal_options = {k: v for k, v in align_options.items() if k not in _ALIGN_CORPUS_OPTIONS}

    aligner_key = aligner = None
    if train_sources:
        # A built-in tokenisation is keyed by its name and the raw corpus, so that a cache hit tokenizes nothing.
        name = getattr(split, "tokenizer_name", None)
        corpus = (train_sources, train_targets) if name else ([split(s) for s in train_sources],
                                                              [split(t) for t in train_targets])
        aligner_key = _digest("aligner", _DROP_CACHE_VERSION, name, *corpus, eflomal_options)
        aligner = "cached"  # what cached alignments were made with, unless align() trains it now

    def train_aligner() -> dict:
        return alignment_priors([split(s) for s in train_sources], [split(t) for t in train_targets],
                                quiet=align_options.get("quiet", True), **eflomal_options,
                                progress=f"DROP: training the aligner on {len(train_sources):,} pairs (eflomal)")

    def align() -> list:
        nonlocal aligner
        priors = None
        if aligner_key is not None:  # loaded only here: cached alignments need no aligner
            priors, was_cached = _cached(directory / f"aligner-{aligner_key}.json" if directory else None,
                                         train_aligner, _valid_priors)
            aligner = "cached" if was_cached else "trained"
        n = len(sources)
        alignments = []
        for run in range(1, runs + 1):
            links = align_corpus(source_words + source_words, reference_words + hypothesis_words, priors=priors,
                                 progress=f"DROP: aligning the test pairs, run {run}/{runs} (eflomal)", **align_options)
            alignments.append([links[:n], links[n:]])
        return alignments

    key = _digest("alignments", _DROP_CACHE_VERSION, aligner_key, source_words, reference_words, hypothesis_words,
                  runs, align_options)
    lengths = [(len(source), len(reference), len(hypothesis))
               for source, reference, hypothesis in zip(source_words, reference_words, hypothesis_words)]
    alignments, was_cached = _cached(directory / f"alignments-{key}.json" if directory else None, align,
                                     lambda value: _valid_alignments(value, runs, lengths))
    as_links = [([[tuple(link) for link in sentence] for sentence in side] for side in run) for run in alignments]
    how = {"runs": runs, "aligner": aligner, "aligner_training_pairs": len(train_sources),
           "alignments": "cached" if was_cached else "aligned", "cache_dir": str(directory) if directory else None}
    return [tuple(run) for run in as_links], how


def align_for_drop(
    sources: Sequence[str],
    hypotheses: Sequence[str],
    references: Sequence[str],
    *,
    train_sources: Sequence[str] | None = None,
    train_targets: Sequence[str] | None = None,
    tokenize: str | Tokenizer = "whitespace",
    **options,
) -> tuple[list[Links], list[Links]]:
    """One eflomal alignment of the test sources to their references and to the hypotheses:
    :func:`drop_alignment_runs` with ``runs=1`` (same arguments; ``cache``, ``cache_dir`` and aligner options go
    through ``options``).

    Returns:
        ``(reference_alignments, hypothesis_alignments)``, per test sentence the ``(source word, target word)``
        links.
    """
    runs, _ = drop_alignment_runs(sources, hypotheses, references, train_sources=train_sources,
                                  train_targets=train_targets, tokenize=tokenize, **{"runs": 1, **options})
    return runs[0]


def drop_score(
    sources: Sequence[str],
    hypotheses: Sequence[str],
    references: Sequence[str],
    *,
    train_sources: Sequence[str] | None = None,
    train_targets: Sequence[str] | None = None,
    alignments: tuple[Sequence, Sequence] | Mapping[str, Sequence] | None = None,
    tokenize: str | Tokenizer = "whitespace",
    **align_options,
) -> float:
    """DROP-score (Malaviya et al., 2018, Sec. 5): the percentage of reference-aligned source words left unaligned.

    Exactly as the authors' ``drop_score.py``::

        DROP = 100 * sum_k |R_k - H_k| / sum_k |R_k|

    where ``R_k`` (``H_k``) is the set of positions of the source words of sentence k that are aligned to at
    least one word of the reference (of the hypothesis). Note the denominator: the source words that have a
    reference link, not all source words. Lower is better; a hypothesis equal to its reference scores about 0
    (exactly 0 with identical alignments). If no source word of the whole test set is aligned to its
    reference, nothing can be dropped and the score is 0.0 (with a warning; the authors' script divides by
    zero). Unlike the script, which reads an empty alignment line as one link of the source word "", a sentence
    without links contributes nothing to ``R_k`` (or to ``H_k``).

    Args:
        sources, hypotheses, references: The test set, one string per sentence.
        train_sources, train_targets: The aligner's training corpus; the alignments are computed with
            :func:`drop_alignment_runs` (eflomal trained on the corpus, then several runs over the test pairs,
            cached; see there), and the score pools the runs (:func:`drop_details`).
        alignments: Precomputed alignments instead: ``(reference_alignments, hypothesis_alignments)`` or a mapping
            with those two keys, each a list with, per sentence, a list of ``(source word index, target word
            index)`` links or a Pharaoh string ``"0-0 1-2"`` (indices into the ``tokenize`` words). Links out of
            range raise ValueError.
        tokenize: Word tokenisation (module docstring).
        **align_options: Passed to :func:`drop_alignment_runs` when aligning (``runs``, ``cache``, ``cache_dir``,
            ``symmetrization``, eflomal options).

    Raises:
        ValueError: for mismatched or empty lists, malformed or out-of-range alignments, or both
            ``alignments`` and a training corpus.
    """
    return drop_details(
        sources,
        hypotheses,
        references,
        train_sources=train_sources,
        train_targets=train_targets,
        alignments=alignments,
        tokenize=tokenize,
        **align_options,
    )["drop"]


def drop_details(
    sources: Sequence[str],
    hypotheses: Sequence[str],
    references: Sequence[str],
    *,
    train_sources: Sequence[str] | None = None,
    train_targets: Sequence[str] | None = None,
    alignments: tuple[Sequence, Sequence] | Mapping[str, Sequence] | None = None,
    tokenize: str | Tokenizer = "whitespace",
    **align_options,
) -> dict:
    """:func:`drop_score` (same arguments) with its counts, alignments and, when it aligned, the spread of the runs.

    With the aligner, DROP pools the :func:`drop_alignment_runs` (``runs``, default :data:`DROP_ALIGNMENT_RUNS`):
    ``100 * sum over runs of dropped / sum over runs of reference-aligned``, the average over the runs' alignments
    (each run's reference-aligned count is close to the others').

    Returns:
        ``{"drop": DROP, "dropped_words": sum_k |R_k - H_k|, "reference_aligned_words": sum_k |R_k|,
        "reference_alignments": [...], "hypothesis_alignments": [...], "sentence_counts": [(|R_k - H_k|, |R_k|)
        per sentence], "drop_runs": [DROP of each run], "drop_std": their sample standard deviation (0.0 for one
        run), "alignment": how they were obtained (see :func:`drop_alignment_runs`; None for precomputed
        alignments)}``: the counts are means over the runs (so DROP is ``100 * sum dropped / sum aligned`` over
        ``sentence_counts``, what :func:`paired_bootstrap_p` resamples), the alignments those of the first run, as
        lists of ``(source word, target word)`` links per sentence.
    """
    sources, hypotheses, references = _check_parallel(sources=sources, hypotheses=hypotheses, references=references)
    split = _get_tokenizer(tokenize)
    how = None
    if alignments is None:
        runs, how = drop_alignment_runs(
            sources,
            hypotheses,
            references,
            train_sources=train_sources,
            train_targets=train_targets,
            tokenize=split,
            **align_options,
        )
    else:
        if train_sources is not None or train_targets is not None or align_options:
            raise ValueError("Pass either precomputed `alignments` or the aligner's training corpus/options, not both")
        if isinstance(alignments, Mapping):
            missing = {"reference_alignments", "hypothesis_alignments"} - set(alignments)
            if missing:
                raise ValueError(f"`alignments` lacks the keys {sorted(missing)}")
            reference_alignments = alignments["reference_alignments"]
            hypothesis_alignments = alignments["hypothesis_alignments"]
        else:
            if isinstance(alignments, (str, bytes)) or len(alignments) != 2:
                raise ValueError("`alignments` must be a pair (reference_alignments, hypothesis_alignments)")
            reference_alignments, hypothesis_alignments = alignments
        for what, value in (
            ("reference_alignments", reference_alignments),
            ("hypothesis_alignments", hypothesis_alignments),
        ):
            if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
                raise TypeError(f"{what} must be a list with one entry per sentence")
            if len(value) != len(sources):
                raise ValueError(f"{what} has {len(value)} entries for {len(sources)} sentences")
        runs = [(reference_alignments, hypothesis_alignments)]
    source_lengths = [len(split(s)) for s in sources]
    reference_lengths, hypothesis_lengths = [len(split(r)) for r in references], [len(split(h)) for h in hypotheses]
    checked, sentence_counts = [], []
    for reference_alignments, hypothesis_alignments in runs:
        reference_links = _check_alignments(reference_alignments, "reference_alignments", source_lengths,
                                            reference_lengths)
        hypothesis_links = _check_alignments(hypothesis_alignments, "hypothesis_alignments", source_lengths,
                                             hypothesis_lengths)
        checked.append((reference_links, hypothesis_links))
        sentence_counts.append(_drop_sentence_counts(reference_links, hypothesis_links))
    counts = [(sum(d for d, _ in run), sum(a for _, a in run)) for run in sentence_counts]
    dropped, aligned = sum(d for d, _ in counts), sum(a for _, a in counts)
    if aligned == 0:
        warnings.warn(
            "No source word is aligned to its reference: DROP is 0.0 (nothing could be dropped)", stacklevel=3
        )
    per_run = [100.0 * d / a if a else 0.0 for d, a in counts]
    if len(runs) == 1:  # the counts stay integers
        dropped_words, aligned_words = dropped, aligned
    else:
        dropped_words, aligned_words = dropped / len(runs), aligned / len(runs)
    return {
        "drop": 100.0 * dropped / aligned if aligned else 0.0,
        "dropped_words": dropped_words,
        "reference_aligned_words": aligned_words,
        "reference_alignments": checked[0][0],
        "hypothesis_alignments": checked[0][1],
        "sentence_counts": [(sum(d for d, _ in sentence) / len(runs), sum(a for _, a in sentence) / len(runs))
                            for sentence in zip(*sentence_counts)],
        "drop_runs": per_run,
        "drop_std": statistics.stdev(per_run) if len(per_run) > 1 else 0.0,
        "alignment": how,
    }


# ---------------------------------------------------------------------------------------------------------------
# Paired bootstrap
# ---------------------------------------------------------------------------------------------------------------


def ratio_score(totals: np.ndarray) -> float:
    """``100 * totals[0] / totals[1]``: REP from summed :func:`rep_sentence_counts`, DROP from summed
    ``sentence_counts`` of :func:`drop_details` (0.0 when the denominator is 0, as :func:`drop_score`)."""
    return 100.0 * float(totals[0]) / float(totals[1]) if totals[1] else 0.0


def paired_bootstrap_p(
    system_statistics: Sequence[Sequence[float]],
    baseline_statistics: Sequence[Sequence[float]],
    score: Callable[[np.ndarray], float] = ratio_score,
    *,
    n_samples: int = 1000,
    seed: int = 12345,
) -> float:
    """p-value of paired bootstrap resampling (Koehn, 2004), computed exactly as sacrebleu's ``PairedTest`` with
    ``test_type="bs"`` does for BLEU, for any corpus score that is a function of summed per-sentence statistics.

    Both systems are scored on the same `n_samples` resamples of the test sentences (drawn with sacrebleu's
    default seed, so the resamples are sacrebleu's). With ``d`` the absolute difference of the two systems'
    scores on a resample, the p-value is ``(1 + #{resamples : d - mean(d) > |real difference|}) / (n_samples +
    1)``: how often a difference at least as large as the observed one arises when the mean difference is
    removed.

    Args:
        system_statistics, baseline_statistics: Per test sentence, the same number of statistics for each system
            (e.g. :func:`rep_sentence_counts`, or ``sentence_counts`` of :func:`drop_details`).
        score: Maps the statistics summed over sentences (a 1-D array) to the corpus score; by default
            :func:`ratio_score`, ``100 * first / second``, which is REP's and DROP's.
        n_samples, seed: Resamples and the seed of NumPy's ``default_rng`` that draws them.
    """
    system, baseline = np.asarray(system_statistics, dtype=float), np.asarray(baseline_statistics, dtype=float)
    if system.ndim != 2 or system.shape != baseline.shape or len(system) == 0:
        raise ValueError(f"Per-sentence statistics of both systems must be non-empty [sentences, statistics] arrays of "
                         f"one shape, got {system.shape} and {baseline.shape}")
    if isinstance(n_samples, bool) or not isinstance(n_samples, int) or n_samples < 1:
        raise ValueError(f"n_samples must be a positive int, got {n_samples!r}")
    resamples = np.random.default_rng(seed).choice(len(system), size=(n_samples, len(system)), replace=True)
    real_difference = abs(score(system.sum(0)) - score(baseline.sum(0)))
    differences = np.array([abs(score(system[rows].sum(0)) - score(baseline[rows].sum(0))) for rows in resamples])
    return (int(np.sum(differences - differences.mean() > real_difference)) + 1) / (n_samples + 1)


# ---------------------------------------------------------------------------------------------------------------
# BLEU by source length
# ---------------------------------------------------------------------------------------------------------------


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
    sources, hypotheses, references = _check_parallel(sources=sources, hypotheses=hypotheses, references=references)
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


# ---------------------------------------------------------------------------------------------------------------
# Everything at once
# ---------------------------------------------------------------------------------------------------------------


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
    sources, hypotheses, references = _check_parallel(sources=sources, hypotheses=hypotheses, references=references)
    result: dict = dict(corpus_scores(hypotheses, references))
    split = _get_tokenizer(tokenize)
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


# ---------------------------------------------------------------------------------------------------------------
# evaluate modules
# ---------------------------------------------------------------------------------------------------------------


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
