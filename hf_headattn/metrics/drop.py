"""DROP (Malaviya et al., 2018, Sec. 5): the share of source words aligned to the reference but not to the output,
with eflomal's alignments (pooled over several runs, cached by a hash of their inputs).

Two layers. The metric itself is a function of links: :func:`drop_counts` (one alignment run) and
:func:`drop_of_links` (several, pooled) take source-reference and source-hypothesis links and return numbers.
Where the links come from is the other layer: :func:`drop_alignment_runs` trains eflomal on a corpus and aligns the
test pairs, both cached (`file_cache`), and :func:`drop_details` / :func:`drop_score` take texts, get their links
from it (or from the caller) and score them.

Tooling, not model runtime: never copied into a checkpoint.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import statistics
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path

from ..file_cache import cached
from .texts import Links, Tokenizer, check_parallel, check_texts, get_tokenizer

logger = logging.getLogger(__name__)

# eflomal draws its random state from /dev/urandom, and one run's DROP can move by a few points on a test set of
# 1,000 sentences (33.54 vs 33.87 and 29.21 vs 26.08 on two calls): DROP pools this many runs and reports the spread.
DROP_ALIGNMENT_RUNS = 5
_DROP_CACHE_VERSION = 1  # bump when what is cached, or how, changes


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
    sources, hypotheses, references = check_parallel(sources=sources, hypotheses=hypotheses, references=references)
    if (train_sources is None) != (train_targets is None):
        raise ValueError("Pass both train_sources and train_targets (the aligner's training corpus), or neither")
    if isinstance(runs, bool) or not isinstance(runs, int) or runs < 1:
        raise ValueError(f"`runs` (eflomal alignment runs) must be a positive integer, got {runs!r}")
    split = get_tokenizer(tokenize)
    corpus = _TrainingCorpus(train_sources, train_targets, split, align_options)
    test_words = ([split(s) for s in sources], [split(r) for r in references], [split(h) for h in hypotheses])
    directory = None if not cache else Path(cache_dir) if cache_dir is not None else default_cache_dir()

    def align() -> list:
        priors = corpus.priors(directory)  # only here: cached alignments need no aligner
        return _align_test_pairs(*test_words, priors, runs, align_options)

    key = _digest("alignments", _DROP_CACHE_VERSION, corpus.key, *test_words, runs, align_options)
    lengths = [tuple(len(words) for words in sentence) for sentence in zip(*test_words)]
    alignments, was_cached = cached(directory / f"alignments-{key}.json" if directory else None, align,
                                    valid=lambda value: _valid_alignments(value, runs, lengths),
                                    what="DROP cache entry", log=logger)
    how = {"runs": runs, "aligner": corpus.state, "aligner_training_pairs": len(corpus.sources),
           "alignments": "cached" if was_cached else "aligned", "cache_dir": str(directory) if directory else None}
    return [tuple([[tuple(link) for link in sentence] for sentence in side] for side in run)
            for run in alignments], how


class _TrainingCorpus:
    """The aligner's training corpus, checked, and the aligner trained on it (eflomal's priors), read from the
    cache or trained when first asked for. `state`: None without a corpus, else "cached" until `priors` trains
    it ("trained"): alignments read from the cache were made with a cached aligner."""

    def __init__(self, train_sources, train_targets, split: Tokenizer, align_options: dict):
        if train_sources is None:  # and train_targets, as drop_alignment_runs checked
            warnings.warn(
                "No training corpus for the DROP aligner: eflomal is trained on the test pairs alone, which gives "
                "poor alignments on small test sets; pass train_sources/train_targets",
                stacklevel=3,
            )
            train_sources, train_targets = [], []
        self.sources = check_texts("train_sources", train_sources)
        self.targets = check_texts("train_targets", train_targets)
        if len(self.sources) != len(self.targets):
            raise ValueError(
                f"Mismatched training corpus: {len(self.sources)} train_sources and {len(self.targets)} train_targets"
            )
        self.split, self.align_options = split, align_options
        self.eflomal_options = {k: v for k, v in align_options.items() if k not in _ALIGN_CORPUS_OPTIONS}
        self.key = self.state = None
        if self.sources:
            # A built-in tokenisation is keyed by its name and the raw corpus, so that a cache hit tokenizes nothing.
            name = getattr(split, "tokenizer_name", None)
            texts = (self.sources, self.targets) if name else ([split(s) for s in self.sources],
                                                               [split(t) for t in self.targets])
            self.key = _digest("aligner", _DROP_CACHE_VERSION, name, *texts, self.eflomal_options)
            self.state = "cached"

    def priors(self, directory: Path | None) -> dict | None:
        """The aligner's priors (None without a training corpus), from `directory`'s cache or trained now."""
        if self.key is None:
            return None
        priors, was_cached = cached(directory / f"aligner-{self.key}.json" if directory else None, self._train,
                                    valid=_valid_priors, what="DROP cache entry", log=logger)
        self.state = "cached" if was_cached else "trained"
        return priors

    def _train(self) -> dict:
        from ..alignment import alignment_priors  # the package's name, looked up now

        return alignment_priors([self.split(s) for s in self.sources], [self.split(t) for t in self.targets],
                                quiet=self.align_options.get("quiet", True), **self.eflomal_options,
                                progress=f"DROP: training the aligner on {len(self.sources):,} pairs (eflomal)")


def _align_test_pairs(source_words: list[list[str]], reference_words: list[list[str]],
                      hypothesis_words: list[list[str]], priors: dict | None, runs: int,
                      align_options: dict) -> list[list[list[Links]]]:
    """`runs` alignments of the test pairs, each [source-reference links, source-hypothesis links]: both portions
    aligned in one eflomal run, so that they are aligned alike."""
    from ..alignment import align_corpus  # the package's name, looked up now

    n = len(source_words)
    alignments = []
    for run in range(1, runs + 1):
        links = align_corpus(source_words + source_words, reference_words + hypothesis_words, priors=priors,
                             progress=f"DROP: aligning the test pairs, run {run}/{runs} (eflomal)", **align_options)
        alignments.append([links[:n], links[n:]])
    return alignments


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
    sources, hypotheses, references = check_parallel(sources=sources, hypotheses=hypotheses, references=references)
    split = get_tokenizer(tokenize)
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
        runs = [_precomputed_alignments(alignments, len(sources))]
    details = drop_of_links(runs, source_lengths=[len(split(s)) for s in sources],
                            reference_lengths=[len(split(r)) for r in references],
                            hypothesis_lengths=[len(split(h)) for h in hypotheses])
    if details["reference_aligned_words"] == 0:
        warnings.warn(
            "No source word is aligned to its reference: DROP is 0.0 (nothing could be dropped)", stacklevel=3
        )
    return {**details, "alignment": how}


def _precomputed_alignments(alignments: tuple[Sequence, Sequence] | Mapping[str, Sequence],
                            n_sentences: int) -> tuple[Sequence, Sequence]:
    """(reference_alignments, hypothesis_alignments) of `drop_details`' `alignments`, a pair or a mapping of them,
    each with one entry per sentence."""
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
        if len(value) != n_sentences:
            raise ValueError(f"{what} has {len(value)} entries for {n_sentences} sentences")
    return reference_alignments, hypothesis_alignments


def drop_of_links(
    runs: Sequence[tuple[Sequence, Sequence]],
    *,
    source_lengths: Sequence[int] | None = None,
    reference_lengths: Sequence[int] | None = None,
    hypothesis_lengths: Sequence[int] | None = None,
) -> dict:
    """DROP pooled over alignment runs, from their links alone: what :func:`drop_details` returns (but its
    ``"alignment"``) for `runs`, each ``(reference_alignments, hypothesis_alignments)`` as :func:`drop_counts`
    takes them. The lengths, when given, are used to reject out-of-range links. Warns of nothing: a test set
    without reference links scores 0.0, which its caller may warn of."""
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
    }
