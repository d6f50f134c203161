"""Translating text with a saved model: the one place in the package that turns sentences into translations.

:func:`translate` takes a model, its tokenizer and a list of sentences, and returns one :class:`Translation` per
sentence, in input order, each with its hypotheses (text, score, Pharaoh word alignment, attention); it reads
nothing and writes nothing. :func:`load_translator` loads a model or a CTranslate2 export as a translator whose
``translate(sources, **options)`` gives the same results for either; the commands (``hf-headattn-translate``,
``-evaluate``, ``-app``) go through it. One job a module:

* :mod:`.translator` — :func:`load_translator` (device, dtype, int8), :class:`ModelTranslator`, and
  :func:`check_options` (an export's refusals before anything is loaded);
* :mod:`.refusals` — :class:`OptionRefused`: the options a translator cannot honour, each with its reason (a
  :class:`Refusal`), worded with the library's names or a command's flags;
* :mod:`.sentences` — :func:`translate` and :func:`translate_sentences`: blank lines, batches (their size for a model
  and its options: :func:`resolve_batch_size`), processes, decoding (through :mod:`hf_headattn.decoding`'s fast path
  or ``generate``), and the hypotheses;
* :mod:`.batches` — length-sorted batches within ``batch_size`` and ``max_tokens``, the default sizes for the
  search that decodes (:func:`default_batch_size`), and the longest source a model takes;
* :mod:`.teacher_forcing` — scores and attention of finished hypotheses, from one teacher-forced pass;
* :mod:`.alignments` — Pharaoh word alignments from that attention;
* :mod:`.forced_alignment` — :func:`align`: the alignments of given translations;
* :mod:`.results` — what :func:`translate` returns: :class:`Translation`, :class:`Hypothesis`,
  :class:`HypothesisAttention`;
* :mod:`.quantization` — :func:`quantize` (int8, CPU), and whether a CPU has native half precision;
* :mod:`.text_files` — :func:`read_lines` (UTF-8 input) and :func:`format_translation` (text and jsonl output);
* :mod:`.ctranslate2_backend` — the same translations from a CTranslate2 export (``hf-headattn-export``), decoded by
  CTranslate2 (:class:`~.ctranslate2_backend.ExportTranslator`; ctranslate2 itself, the ``[deploy]`` extra, is
  imported only when an export loads).

torch, Transformers and the models are imported where they are used, so that importing this package (and the
command's ``--help``) is instant. Tooling, not model runtime: never copied into a checkpoint.
"""

from .alignments import ALIGNMENT_HEADS, cross_attention_layers, default_alignment_layer
from .batches import (AUTO_BATCH_SIZE, DEFAULT_BATCH_ROWS, DEFAULT_BATCH_SIZE, DEFAULT_MAX_TOKENS, GENERATE_BATCH_SIZE,
                      default_batch_size, length_sorted_batches, source_token_limit)
from .forced_alignment import align
from .quantization import QUANTIZATIONS, quantize
from .results import Hypothesis, HypothesisAttention, Translation
from .sentences import fast_path_by_default, resolve_batch_size, translate, translate_sentences
from .text_files import OUTPUT_FORMATS, format_translation, read_lines
from .translator import ModelTranslator, OptionRefused, Refusal, check_options, load_translator

__all__ = [
    "ALIGNMENT_HEADS",
    "AUTO_BATCH_SIZE",
    "DEFAULT_BATCH_ROWS",
    "DEFAULT_BATCH_SIZE",
    "DEFAULT_MAX_TOKENS",
    "GENERATE_BATCH_SIZE",
    "OUTPUT_FORMATS",
    "QUANTIZATIONS",
    "Hypothesis",
    "HypothesisAttention",
    "ModelTranslator",
    "OptionRefused",
    "Refusal",
    "Translation",
    "align",
    "check_options",
    "cross_attention_layers",
    "default_alignment_layer",
    "default_batch_size",
    "fast_path_by_default",
    "format_translation",
    "length_sorted_batches",
    "load_translator",
    "quantize",
    "read_lines",
    "resolve_batch_size",
    "source_token_limit",
    "translate",
    "translate_sentences",
]
