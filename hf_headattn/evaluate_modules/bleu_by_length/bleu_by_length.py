"""Corpus BLEU per source-length bucket as a Hugging Face `evaluate` metric, computed by `hf_headattn.metrics`."""

import datasets
import evaluate

from hf_headattn.metrics import DEFAULT_LENGTH_BUCKETS, bleu_by_length


_CITATION = """\
@inproceedings{cui-etal-2019-mixed,
    title = "Mixed Multi-Head Self-Attention for Neural Machine Translation",
    author = "Cui, Hongyi and Iida, Shohei and Hung, Po-Hsuan and Utsuro, Takehito and Nagata, Masaaki",
    booktitle = "Proceedings of the 3rd Workshop on Neural Generation and Translation",
    year = "2019",
    publisher = "Association for Computational Linguistics",
    url = "https://aclanthology.org/D19-5622",
}
@inproceedings{iida-etal-2019-multi,
    title = "A Multi-Hop Attention for {RNN} based Neural Machine Translation",
    author = "Iida, Shohei and Kimura, Ryuichiro and Cui, Hongyi and Hung, Po-Hsuan and Utsuro, Takehito and Nagata, Masaaki",
    booktitle = "Proceedings of the 8th Workshop on Patent and Scientific Literature Translation",
    year = "2019",
}
@inproceedings{post-2018-call,
    title = "A Call for Clarity in Reporting {BLEU} Scores",
    author = "Post, Matt",
    booktitle = "Proceedings of the Third Conference on Machine Translation: Research Papers",
    year = "2018",
    publisher = "Association for Computational Linguistics",
    url = "https://aclanthology.org/W18-6319",
    pages = "186--191",
}
"""

_DESCRIPTION = """\
Corpus BLEU (sacrebleu, default settings) computed separately on groups of sentences of similar source length,
as in Cui et al. (2019, Fig. 2) and Iida et al. (2019, Table 3). The source length is its number of whitespace
words; boundaries b0 < b1 < ... < bm give the buckets [0, b0), [b0, b1), ..., [bm, inf), labelled "<b0",
"b0-(b1-1)", ..., ">=bm" (default boundaries 10, 20, 30, 40, 50: "<10", "10-19", ..., "40-49", ">=50").
"""

_KWARGS_DESCRIPTION = """
Args:
    sources: list of source sentences, one string each (they only decide the buckets).
    predictions: list of translations, one string per sentence.
    references: list of references, one string per sentence (a single reference each).
    buckets: increasing positive bucket boundaries (default (10, 20, 30, 40, 50)).
Returns:
    bleu_by_length: {label: {"count": number of sentences, "bleu": corpus BLEU, or None for an empty bucket}}.
Examples:
    >>> metric = evaluate.load("path/to/hf_headattn/evaluate_modules/bleu_by_length")
    >>> metric.compute(sources=["a b c"], predictions=["x y z w"], references=["x y z w"], buckets=[10])
    {'bleu_by_length': {'<10': {'count': 1, 'bleu': 100.00000000000004}, '>=10': {'count': 0, 'bleu': None}}}
"""


@evaluate.utils.file_utils.add_start_docstrings(_DESCRIPTION, _KWARGS_DESCRIPTION)
class BleuByLength(evaluate.Metric):
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
            codebase_urls=["https://github.com/mjpost/sacrebleu"],
            reference_urls=["https://aclanthology.org/D19-5622"],
        )

    def _compute(self, sources, predictions, references, buckets=DEFAULT_LENGTH_BUCKETS):
        return {"bleu_by_length": bleu_by_length(sources, predictions, references, buckets=tuple(buckets))}
