"""DROP-score (Malaviya et al., 2018) as a Hugging Face `evaluate` metric, computed by `hf_headattn.metrics`."""

import datasets
import evaluate

from hf_headattn.metrics import drop_details


_CITATION = """\
@inproceedings{malaviya-etal-2018-sparse,
    title = "Sparse and Constrained Attention for Neural Machine Translation",
    author = "Malaviya, Chaitanya and Ferreira, Pedro and Martins, Andr{\\'e} F. T.",
    booktitle = "Proceedings of the 56th Annual Meeting of the Association for Computational Linguistics (Volume 2: Short Papers)",
    year = "2018",
    address = "Melbourne, Australia",
    publisher = "Association for Computational Linguistics",
    url = "https://aclanthology.org/P18-2059",
    pages = "370--376",
}
"""

_DESCRIPTION = """\
DROP-score: the percentage of dropped source words (Malaviya et al., 2018, Sec. 5), exactly as the authors'
drop_score.py. With R_k (H_k) the set of source words of sentence k aligned to at least one reference
(hypothesis) word,

    DROP = 100 * sum_k |R_k - H_k| / sum_k |R_k|.

Alignments: eflomal, symmetrized with grow-diag-final-and, trained once on the aligner's training corpus
(train_sources, train_targets; cached), then several runs (runs=, default 5) over the test (source, reference)
and (source, hypothesis) pairs with what it learned, pooled, their alignments cached (the same inputs give the same
score); or precomputed alignments. Words are whitespace-split. Lower is better.
"""

_KWARGS_DESCRIPTION = """
Args:
    sources: list of source sentences, one string each.
    predictions: list of translations, one string per sentence.
    references: list of references, one string per sentence (a single reference each).
    train_sources, train_targets: the aligner's training corpus (lists of strings); recommended.
    alignments: precomputed (reference_alignments, hypothesis_alignments), per sentence a list of
        (source word index, target word index) links or a "0-0 1-2" string; replaces the aligner.
    tokenize: "whitespace" (default), "13a" or a callable str -> list[str].
    Further keyword arguments (runs, cache, cache_dir, symmetrization, eflomal options) go to
    hf_headattn.metrics.drop_alignment_runs.
Returns:
    drop: the DROP-score in percent (lower is better),
    dropped_words: sum_k |R_k - H_k|,
    reference_aligned_words: sum_k |R_k| (means over the runs),
    drop_std: the standard deviation of the runs' DROP.
Examples:
    >>> drop = evaluate.load("path/to/hf_headattn/evaluate_modules/drop")
    >>> drop.compute(sources=["a b"], predictions=["x"], references=["x y"],
    ...              alignments=([[(0, 0), (1, 1)]], [[(0, 0)]]))
    {'drop': 50.0, 'dropped_words': 1, 'reference_aligned_words': 2}
"""


@evaluate.utils.file_utils.add_start_docstrings(_DESCRIPTION, _KWARGS_DESCRIPTION)
class Drop(evaluate.Metric):
    def _info(self):
        return evaluate.MetricInfo(
            description=_DESCRIPTION,
            citation=_CITATION,
            inputs_description=_KWARGS_DESCRIPTION,
            features=datasets.Features(
                {
                    "sources": datasets.Value("string"),
                    "predictions": datasets.Value("string"),
                    "references": datasets.Value("string"),
                }
            ),
            codebase_urls=["https://github.com/Unbabel/sparse_constrained_attention/tree/master/coverage-eval"],
            reference_urls=["https://aclanthology.org/P18-2059"],
        )

    def _compute(
        self,
        sources,
        predictions,
        references,
        train_sources=None,
        train_targets=None,
        alignments=None,
        tokenize="whitespace",
        **align_options,
    ):
        details = drop_details(
            sources,
            predictions,
            references,
            train_sources=train_sources,
            train_targets=train_targets,
            alignments=alignments,
            tokenize=tokenize,
            **align_options,
        )
        return {key: details[key] for key in ("drop", "dropped_words", "reference_aligned_words", "drop_std")}
