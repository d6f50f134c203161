"""Word alignment of a tokenized parallel corpus with eflomal: tokens numbered into the lines eflomal reads, one run
of its binary (``eflomal_binary``) for both directions, and the two symmetrized; and the priors of one corpus, to
align other pairs as if trained on it too.

Tooling, not model runtime: never copied into a checkpoint.
"""

from __future__ import annotations

import io
import logging
import warnings
from collections.abc import Hashable, Mapping, Sequence

from . import eflomal_binary
from .symmetrization import SYMMETRIZATIONS, Links, symmetrize

logger = logging.getLogger(__name__)

# eflomal's input writer stores sentences of this many tokens or more as empty sentences (no links).
EFLOMAL_MAX_SENTENCE_LENGTH = 0x400


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
            alignments can differ slightly between runs; a non-None seed is ignored, with a log line saying so.
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
    eflomal = eflomal_binary.eflomal_package("align_corpus")
    _check_sides(source_tokens, target_tokens)
    _check_options(symmetrization, aligner_options)
    if len(source_tokens) == 0:
        return []
    numbers = ({}, {}) if priors is None else (dict(priors["source_numbers"]), dict(priors["target_numbers"]))
    source_lines = _eflomal_lines(source_tokens, "source", numbers[0])
    target_lines = _eflomal_lines(target_tokens, "target", numbers[1])
    _warn_of_skipped_pairs(source_tokens, target_tokens)
    if seed is not None:
        # a log line, not a warning: nothing the user can do about it (eflomal's binary takes no seed)
        logger.info("eflomal cannot be seeded (it draws its random state from /dev/urandom): `seed` is ignored and "
                    "alignments may differ slightly between runs")

    forward, reverse = eflomal_binary.run_eflomal(
        eflomal.Aligner(**aligner_options), source_lines, target_lines,
        priors=None if priors is None else priors["priors"], quiet=quiet, progress=progress)
    return [
        symmetrize(fwd, rev, len(source), len(target), method=symmetrization)
        for fwd, rev, source, target in zip(forward, reverse, source_tokens, target_tokens)
    ]


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
    eflomal = eflomal_binary.eflomal_package("alignment_priors")
    _check_sides(source_tokens, target_tokens)
    if not all(isinstance(token, str) for side in (source_tokens, target_tokens) for sentence in side
               for token in sentence):
        raise TypeError("alignment_priors takes string tokens (its numbering must survive a JSON round trip)")
    source_numbers, target_numbers = {}, {}
    source_lines = _eflomal_lines(source_tokens, "source", source_numbers)
    target_lines = _eflomal_lines(target_tokens, "target", target_numbers)
    forward, reverse = eflomal_binary.run_eflomal(eflomal.Aligner(**aligner_options), source_lines, target_lines,
                                                  quiet=quiet, progress=progress)
    counts = eflomal.calculate_priors(source_lines, target_lines, _pharaoh_lines(forward), _pharaoh_lines(reverse))
    text = io.StringIO()
    eflomal.write_priors(text, *counts)
    return {"pairs": len(source_lines), "source_numbers": source_numbers, "target_numbers": target_numbers,
            "priors": text.getvalue()}


def _check_sides(source_tokens: Sequence, target_tokens: Sequence) -> None:
    if len(source_tokens) != len(target_tokens):
        raise ValueError(
            f"The corpus sides differ in length: {len(source_tokens)} source and {len(target_tokens)} target sentences"
        )


def _check_options(symmetrization: str, aligner_options: dict) -> None:
    if symmetrization not in SYMMETRIZATIONS:
        raise ValueError(f"Unknown symmetrization {symmetrization!r}; accepted: {', '.join(SYMMETRIZATIONS)}")
    stemming = [k for k in aligner_options if k.endswith(("_prefix_len", "_suffix_len")) and aligner_options[k]]
    if stemming:
        raise ValueError(f"align_corpus does not support eflomal's stemming options {stemming}: tokens are numbered")


def _warn_of_skipped_pairs(source_tokens: Sequence[Sequence], target_tokens: Sequence[Sequence]) -> None:
    too_long = sum(
        1
        for source, target in zip(source_tokens, target_tokens)
        if max(len(source), len(target)) >= EFLOMAL_MAX_SENTENCE_LENGTH
    )
    if too_long:
        warnings.warn(
            f"{too_long} sentence pair(s) have {EFLOMAL_MAX_SENTENCE_LENGTH} tokens or more on a side; eflomal "
            "skips them, so they get no alignment links",
            stacklevel=3,
        )


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


def _pharaoh_lines(alignments: list[Links]) -> list[str]:
    return [" ".join(f"{i}-{j}" for i, j in links) for links in alignments]
