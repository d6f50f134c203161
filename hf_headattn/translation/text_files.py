"""Sentences in and translations out as text: reading a UTF-8 file of sentences, one a line (:func:`read_lines`, the
reader every command shares, `hf_headattn.parallel_data.read_lines`: "\\n", "\\r\\n" and a lone "\\r" end a line),
and writing one input line's translations (:func:`format_translation`, :data:`OUTPUT_FORMATS`):

* ``text``: one line per input line, line i translating input line i (a blank line stays blank); with alignments,
  ``translation ||| alignment`` (Marian's convention); with ``nbest`` > 1, ``nbest`` lines per non-blank input line,
  ``i ||| translation ||| score`` (Moses' n-best convention, i counting input lines from 0), `` ||| alignment``
  appended with alignments;
* ``jsonl``: one object per input line, blank lines included: ``{"source": ..., "translations": [{"text": ...,
  "score": ..., "alignment": ...}]}`` (best first; empty for a blank line; ``alignment`` with alignments).

Tooling, not model runtime: never copied into a checkpoint.
"""

from __future__ import annotations

import json

from ..parallel_data import read_lines
from .results import Hypothesis, Translation

__all__ = ["OUTPUT_FORMATS", "format_translation", "read_lines"]

OUTPUT_FORMATS = ("text", "jsonl")


def format_translation(translation: Translation, index: int, *, output_format: str = "text", nbest: int = 1,
                       alignments: bool = False) -> str:
    """Input line `index`'s output (0-based), newline-terminated, in `output_format` (see the module's docstring);
    `alignments`: write each hypothesis' alignment. Scores are written with ``nbest`` > 1 and in jsonl.

    Raises:
        ValueError: an unknown `output_format`.
    """
    if output_format not in OUTPUT_FORMATS:
        raise ValueError(f"Unknown output_format {output_format!r}; accepted: {', '.join(OUTPUT_FORMATS)}")
    if output_format == "jsonl":
        hypotheses = [{"text": hypothesis.text, "score": hypothesis.score,
                       **({"alignment": hypothesis.alignment} if alignments else {})}
                      for hypothesis in translation.hypotheses]
        return json.dumps({"source": translation.source, "translations": hypotheses}, ensure_ascii=False) + "\n"
    if nbest == 1:
        best = translation.hypotheses[0] if translation.hypotheses else Hypothesis("", alignment="")
        return best.text + (f" ||| {best.alignment}" if alignments else "") + "\n"
    return "".join(f"{index} ||| {hypothesis.text} ||| {hypothesis.score:.6f}"
                   + (f" ||| {hypothesis.alignment}" if alignments else "") + "\n"
                   for hypothesis in translation.hypotheses)
