"""REP-score (Malaviya et al., 2018) as a Hugging Face `evaluate` metric; computed by `hf_headattn.metrics`."""

import datasets
import evaluate

from hf_headattn.metrics import rep_score


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
REP-score: a measure of repetitions in machine translation output (Malaviya et al., 2018, Sec. 5), exactly as the
authors' rep_score.py. Per sentence, with t(s) and r(s) the counts of the n-gram s in the output and in the
reference,

    sigma = lambda1 * sum_{s: t(s) >= 2} max(0, t(s) - r(s)) + lambda2 * sum_w max(0, t(ww) - r(ww)),

the second sum running over the bigrams made of one word twice, at any count. REP = 100 * sum of sigma over the
sentences / number of reference words. Defaults n = 2, lambda1 = 1, lambda2 = 2; words are whitespace-split.
Lower is better.
"""

_KWARGS_DESCRIPTION = """
Args:
    predictions: list of translations, one string per sentence.
    references: list of references, one string per sentence (a single reference each).
    n: n-gram order of the first term (default 2; the repeated-word term always uses bigrams).
    lambda1: weight of the repeated n-gram term (default 1.0).
    lambda2: weight of the repeated-word bigram term (default 2.0).
    tokenize: "whitespace" (default), "13a" (sacrebleu's 13a tokenizer first) or a callable str -> list[str].
Returns:
    rep: the corpus REP-score (0 for no repetitions; lower is better).
Examples:
    >>> rep = evaluate.load("path/to/hf_headattn/evaluate_modules/rep")
    >>> rep.compute(predictions=["the cat cat sat"], references=["the cat sat"])
    {'rep': 66.66666666666667}
"""


@evaluate.utils.file_utils.add_start_docstrings(_DESCRIPTION, _KWARGS_DESCRIPTION)
class Rep(evaluate.Metric):
    def _info(self):
        return evaluate.MetricInfo(
            description=_DESCRIPTION,
            citation=_CITATION,
            inputs_description=_KWARGS_DESCRIPTION,
            features=datasets.Features(
                {"predictions": datasets.Value("string"), "references": datasets.Value("string")}
            ),
            codebase_urls=["https://github.com/Unbabel/sparse_constrained_attention/tree/master/coverage-eval"],
            reference_urls=["https://aclanthology.org/P18-2059"],
        )

    def _compute(self, predictions, references, n=2, lambda1=1.0, lambda2=2.0, tokenize="whitespace"):
        return {
            "rep": rep_score(predictions, references, n=n, lambda1=lambda1, lambda2=lambda2, tokenize=tokenize)
        }
