"""Paired bootstrap tests (sacrebleu's) of corpus scores computed from per-sentence statistics (REP, DROP).

Tooling, not model runtime: never copied into a checkpoint.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np


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
