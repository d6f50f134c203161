r"""Translating with a CTranslate2 export, the folder ``hf-headattn-export`` writes: the translator
:func:`~.translator.load_translator` returns for one (:class:`ExportTranslator`), which ``hf-headattn-translate``,
``hf-headattn-evaluate`` and :func:`hf_headattn.export.translate_with_ctranslate2` run.

* :func:`find_export` recognises an export by its files (the export record, or CTranslate2's ``model.bin`` and
  ``config.json``), so no flag says which kind of folder ``--model`` is; a local folder that is neither a saved model
  nor an export is refused, naming it.
* :func:`export_refusals` lists, before anything is loaded, every option an export cannot honour, each a
  :class:`~.refusals.Refusal` (option, value, reason; :func:`check_export_options` raises them as one
  :class:`~.refusals.OptionRefused`): ``fast=False`` (an export decodes with CTranslate2's search), ``tokenizer``
  (an export splits text with its own ``tokenizer/``), ``coverage_penalty`` (this package's Transformer decodes
  without one), ``attention`` (CTranslate2 gives one layer's, heads averaged), ``alignment_layer`` other than the
  exported one and ``alignment_heads="hop"``, ``alignments`` with an export written before exports kept their
  alignment heads or of a model guided with full target context, ``do_sample`` with beams, ``early_stopping`` False
  or ``"never"`` (CTranslate2 ends a sentence's beam search once it has ``num_beams`` finished hypotheses, as
  ``early_stopping=True`` does; the option with greedy search), and several processes (torchrun).
* :func:`load_export` loads the tokenizer and a ``ctranslate2.Translator`` (device auto/cpu/cuda/cuda:N; the dtype
  and int8 become CTranslate2's compute type, :func:`compute_type_of`, by default the type the export was written
  in; the CPU threads PyTorch would use).
* :meth:`ExportTranslator.translate` gives what :func:`~hf_headattn.translation.translate` gives for the model,
  with CTranslate2 decoding: the same planned batches (:func:`~.sentences.source_batches`: blank lines stay blank,
  too-long sources cut with the same warning or refused with ``strict``, length-sorted ``batch_size`` /
  ``max_tokens`` batches, queued to the translator so that ``inter_threads`` translators work in parallel), and
  each :class:`~.results.Hypothesis` has the same text, score and alignment: ``num_beams`` -> ``beam_size``,
  ``nbest`` -> ``num_hypotheses``, ``max_new_tokens`` -> ``max_decoding_length`` (``max_length`` counts the start
  token; ``min_new_tokens`` -> ``min_decoding_length``, 0 unless the generation config sets a minimum, so that a
  translation may be empty as with the model), ``length_penalty`` and ``no_repeat_ngram_size`` as they are,
  ``do_sample`` / ``top_k`` / ``top_p`` / ``temperature`` / ``seed`` -> CTranslate2's sampling; the defaults are the
  exported model's generation config (``generation_config.json`` in the export). CTranslate2's scores are this
  package's (the log-probability of the hypothesis, end of sentence included, divided by ``length **
  length_penalty``); sampled hypotheses are scored by ``score_batch``, whose log-probabilities are those of the
  model, not of the sampling distribution. Alignments come from ``return_attention``: the export's CTranslate2
  decoder averages every head of its last layer, as ``alignment_heads="mean"`` does (a model trained with guided
  alignment: its guided heads at its guided layer, as the model's default alignments); CTranslate2 4.x's beam search
  returns the first step's attention of padded batches wrongly, so that step's attention comes from a one-step
  greedy pass, which computes the same (:func:`queue_first_step_attention`).

What differs: beam search can end differently on some lines (CTranslate2 ends a sentence's search once it has
``num_beams`` finished hypotheses, Transformers' ``early_stopping=True``, where a model's generation config usually
leaves Transformers' default, False, which searches on while a running beam may still overtake them; and it applies
``no_repeat_ngram_size`` differently within the beam); greedy search gives the same lines, up to the kernels'
rounding.

Tooling, not model runtime: never copied into a checkpoint.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from .alignments import decoded_word_indices, pharaoh, source_word_indices
from .batches import AUTO_BATCH_SIZE, DEFAULT_BATCH_SIZE, DEFAULT_MAX_TOKENS, given_or_auto
from .refusals import Refusal, refuse
from .results import Hypothesis, Translation
from .sentences import check_nbest, ranked, source_batches

# ctranslate2, torch and Transformers are imported where they are used, so that the commands' `--help` is instant.

__all__ = ["CTRANSLATE2_FILES", "DEPLOY_EXTRA", "EXPORT_RECORD", "GENERATION_CONFIG", "GENERATION_OPTIONS",
           "TOKENIZER_FOLDER", "CTranslate2Export", "ExportTranslator", "check_export_options", "compute_type_of",
           "ctranslate2_device", "export_batch_size", "export_lead", "export_refusals", "find_export",
           "generation_defaults", "import_ctranslate2", "load_export", "queue_first_step_attention",
           "translate_export"]

logger = logging.getLogger(__name__)

DEPLOY_EXTRA = 'pip install "ctranslate2>=4.5" (the deploy extra)'
EXPORT_RECORD = "hf_headattn_export.json"  # what was exported from where, written by hf-headattn-export
CTRANSLATE2_FILES = ("model.bin", "config.json")  # a CTranslate2 model folder's own files
TOKENIZER_FOLDER = "tokenizer"  # the model's tokenizer, beside CTranslate2's files
GENERATION_CONFIG = "generation_config.json"  # the exported model's decoding defaults

# The generation options translate_export maps to CTranslate2's (the commands' decoding flags of the same names).
GENERATION_OPTIONS = ("num_beams", "max_new_tokens", "min_new_tokens", "length_penalty", "no_repeat_ngram_size",
                      "do_sample", "top_k", "top_p", "temperature")
# Transformers' defaults of those options (what a generation_config.json leaves out; without max_length, generate
# makes 20 new tokens, fewer where the position table ends sooner)
_DEFAULT_NEW_TOKENS = 20
_TRANSFORMERS_DEFAULTS = {"num_beams": 1, "max_length": None, "max_new_tokens": None, "min_length": 0,
                          "min_new_tokens": None, "length_penalty": 1.0, "no_repeat_ngram_size": 0,
                          "do_sample": False, "top_k": 50, "top_p": 1.0, "temperature": 1.0}
# exports written before they kept generation_config.json: CTranslate2's own defaults
_EXPORT_WITHOUT_GENERATION_CONFIG = {**_TRANSFORMERS_DEFAULTS, "max_new_tokens": 256}

# (--dtype, --quantize) -> CTranslate2's compute type; "default": the type the export was written in
_COMPUTE_TYPES = {
    "none": {"auto": "default", "float32": "float32", "float16": "float16", "bfloat16": "bfloat16"},
    "int8": {"auto": "int8", "float32": "int8_float32", "float16": "int8_float16", "bfloat16": "int8_bfloat16"},
}


def import_ctranslate2(purpose: str = "Translating with a CTranslate2 export"):
    """The ctranslate2 module.

    Raises:
        ImportError: ctranslate2 is not installed, naming the extra that installs it.
    """
    try:
        import ctranslate2
    except ImportError:
        raise ImportError(f"{purpose} needs the ctranslate2 package: {DEPLOY_EXTRA}"
                          ) from None
    return ctranslate2


def find_export(model: str | Path) -> Path | None:
    """`model` as a CTranslate2 export folder, recognised by its files (the export record, or CTranslate2's
    ``model.bin`` and ``config.json``); None for anything else a command loads (a saved model folder, a Hub id).

    Raises:
        ValueError: a local folder that is neither a saved model folder nor an export, naming it.
    """
    path = Path(model)
    if not path.is_dir():
        return None
    if (path / EXPORT_RECORD).is_file() or all((path / name).is_file() for name in CTRANSLATE2_FILES):
        return path
    if (path / "config.json").is_file():
        return None
    raise ValueError(f"{model} is neither a saved model folder (config.json and weights, as hf-headattn-train "
                     f"writes) nor a CTranslate2 export ({', '.join(CTRANSLATE2_FILES)} and {EXPORT_RECORD}, as "
                     "hf-headattn-export writes)")


def _read_record(folder: Path) -> dict:
    path = folder / EXPORT_RECORD
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}


def generation_defaults(folder: str | Path) -> dict:
    """The decoding defaults of an export (:data:`GENERATION_OPTIONS`, ``max_new_tokens`` and ``min_new_tokens``
    from ``max_length`` and ``min_length`` as Transformers' generate derives them, and ``max_length`` as written):
    its model's ``generation_config.json``, or Transformers' defaults with CTranslate2's 256 tokens for exports
    written before they kept one."""
    path = Path(folder) / GENERATION_CONFIG
    if not path.is_file():
        settings = dict(_EXPORT_WITHOUT_GENERATION_CONFIG)
    else:
        written = json.loads(path.read_text(encoding="utf-8"))
        settings = {name: written.get(name, default) if written.get(name) is not None else default
                    for name, default in _TRANSFORMERS_DEFAULTS.items()}
    if settings["max_new_tokens"] is None:  # max_length and min_length count the decoder's start token
        positions = _read_record(Path(folder)).get("max_position_embeddings")
        settings["max_new_tokens"] = (max(settings["max_length"] - 1, 1) if settings["max_length"] is not None
                                      else min(_DEFAULT_NEW_TOKENS, (positions or 10**9) - 1))
    if settings["min_new_tokens"] is None:
        settings["min_new_tokens"] = max(settings["min_length"] - 1, 0)
    return {name: settings[name] for name in (*GENERATION_OPTIONS, "max_length")}


def export_refusals(folder: str | Path, **options) -> list[Refusal]:
    """The options an export cannot honour (nothing is loaded: the export record and generation config are read).
    `options` by the names :func:`~.translator.load_translator` and ``translate`` take them: ``fast`` (False: generate),
    ``tokenizer``, ``coverage_penalty``, ``distributed`` (True under several processes), ``attention``,
    ``alignments``, ``alignment_layer``, ``alignment_heads``, ``do_sample``, ``num_beams``, ``early_stopping``;
    others are honoured by :class:`ExportTranslator` or mean nothing for an export."""
    folder = Path(folder)
    return [*_setup_refusals(options), *_alignment_refusals(_read_record(folder), options),
            *_search_refusals(folder, options)]


def _setup_refusals(options: dict) -> list[Refusal]:
    refusals = []
    if options.get("fast") is False:
        refusals.append(Refusal("fast", False, "an export decodes with CTranslate2's own search"))
    if options.get("tokenizer") is not None:
        refusals.append(Refusal("tokenizer", options["tokenizer"], f"an export splits text with its own "
                                f"{TOKENIZER_FOLDER}/, the one it was exported with"))
    if options.get("coverage_penalty"):
        refusals.append(Refusal("coverage_penalty", options["coverage_penalty"], "an export is a Transformer, which "
                                "decodes without a coverage penalty in this package; the LSTM family has one"))
    if options.get("distributed"):
        refusals.append(Refusal("distributed", True, "torchrun: an export translates in one process, with "
                                "CTranslate2's threads"))
    if options.get("attention"):
        refusals.append(Refusal("attention", True, "CTranslate2 gives one layer's attention with its heads averaged, "
                                "not every layer's and head's"))
    return refusals


def _alignment_refusals(record: dict, options: dict) -> list[Refusal]:
    if not options.get("alignments"):
        return []
    refusals, alignment, layer = [], record.get("alignment"), options.get("alignment_layer")
    if alignment is None:
        refusals.append(Refusal("alignments", True, "this export's CTranslate2 attention is one head's, not the heads' "
                                "mean: it was written before exports averaged them; export the model again with "
                                "hf-headattn-export"))
    elif alignment.get("full_context"):
        refusals.append(Refusal("alignments", True, "this model reads its alignments with full target context "
                                "(guided_alignment_full_context: a second decoder pass without the causal mask), "
                                "which CTranslate2 does not run; translate with the model folder for them"))
    elif layer is not None and not (-alignment["layers"] <= layer < alignment["layers"]
                                    and layer % alignment["layers"] == alignment["layer"]):
        refusals.append(Refusal("alignment_layer", layer, f"an export gives the attention of decoder layer "
                                f"{alignment['layer']}, chosen when it was exported; leave "
                                "{alignment_layer} out"))
    if options.get("alignment_heads", "mean") != "mean":
        refusals.append(Refusal("alignment_heads", options["alignment_heads"], "an export averages the heads: a "
                                "softmax model has no weights over heads"))
    return refusals


def _search_refusals(folder: Path, options: dict) -> list[Refusal]:
    defaults = generation_defaults(folder) if options.get("do_sample") or options.get("num_beams") is None else {}
    do_sample = options.get("do_sample") or defaults.get("do_sample", False)
    num_beams = options.get("num_beams") or defaults.get("num_beams", 1)
    refusals = []
    if do_sample and num_beams > 1:
        refusals.append(Refusal("do_sample", True, "CTranslate2 samples with beam 1: pass {num_beams} 1",
                                shape=f"{{option}} with {num_beams} beams ({{reason}})"))
    early_stopping = options.get("early_stopping")
    if early_stopping is not None and early_stopping is not True:
        refusals.append(Refusal("early_stopping", early_stopping, "CTranslate2's beam search ends a sentence once it "
                                "has num_beams finished hypotheses: {early_stopping} true, what an export always "
                                "does"))
    elif early_stopping is not None and num_beams == 1:
        refusals.append(Refusal("early_stopping", early_stopping, "it ends beam search; pass {num_beams} 2 or more",
                                shape="{name} with greedy search (num_beams 1): {reason}"))
    return refusals


def export_lead(folder: str | Path) -> str:
    """How an export's refusals begin (:class:`~.refusals.OptionRefused`)."""
    return f"{folder} is a CTranslate2 export, which cannot take "


def check_export_options(folder: str | Path, **options) -> None:
    """Refuse the options an export cannot honour (:func:`export_refusals`), before anything is read or loaded.

    Raises:
        OptionRefused (a ValueError): naming the export and every option it cannot honour, with the reason.
    """
    refuse(export_lead(folder), export_refusals(folder, **options))


def compute_type_of(dtype: str = "auto", quantize: str = "none") -> str:
    """CTranslate2's compute type for the commands' ``--dtype`` and ``--quantize`` (``auto`` / ``none``:
    ``"default"``, the type the export was written in).

    Raises:
        ValueError: an unknown dtype or quantization, naming what is accepted.
    """
    if quantize not in _COMPUTE_TYPES:
        raise ValueError(f"Unknown quantize={quantize!r}; accepted: {', '.join(_COMPUTE_TYPES)}")
    if dtype not in _COMPUTE_TYPES[quantize]:
        raise ValueError(f"Unknown dtype={dtype!r}; accepted: {', '.join(_COMPUTE_TYPES[quantize])}")
    return _COMPUTE_TYPES[quantize][dtype]


def ctranslate2_device(device: str) -> tuple[str, int]:
    """``auto`` / ``cpu`` / ``cuda`` / ``cuda:N`` -> CTranslate2's (device, device_index).

    Raises:
        ImportError: ctranslate2 is not installed, naming the extra that installs it.
        ValueError: an unknown device, or a CUDA device CTranslate2 does not see.
    """
    ctranslate2 = import_ctranslate2()
    if not isinstance(device, str) or not (device in ("auto", "cpu", "cuda") or device.startswith("cuda:")):
        raise ValueError(f"Unknown device {device!r}; accepted: auto, cpu, cuda, cuda:N")
    count = ctranslate2.get_cuda_device_count()
    if device == "auto":
        return ("cuda", 0) if count else ("cpu", 0)
    if device == "cpu":
        return "cpu", 0
    index = int(device.partition(":")[2] or 0)
    if count == 0:
        raise ValueError(f"device={device!r} was asked for, but ctranslate2 {ctranslate2.__version__} sees no CUDA "
                         "device (a CPU-only build, or no CUDA driver); use cpu or auto")
    if index >= count:
        raise ValueError(f"device={device!r}: ctranslate2 sees only {count} CUDA device(s)")
    return "cuda", index


@dataclass
class CTranslate2Export:
    """A loaded export: its folder, ``ctranslate2.Translator``, tokenizer, export record, decoding defaults
    (:func:`generation_defaults`), and where and in what type it computes."""

    folder: Path
    translator: object
    tokenizer: object
    record: dict
    generation: dict
    device: str
    compute_type: str

    def describe(self) -> dict:
        """What an evaluation records of the model: its path and name, the exported model's type and parameters
        (None for exports that did not record them), where it was exported from and its weights' type."""
        return {"path": str(self.folder.resolve()), "name": self.folder.resolve().name,
                "model_type": self.record.get("model_type"), "architecture": "CTranslate2 export",
                "parameters": self.record.get("parameters"), "exported_from": self.record.get("source"),
                "quantization": self.record.get("quantization")}

    def source_token_limit(self) -> int | None:
        """The longest source the model takes, in tokens (as :func:`~.batches.source_token_limit` for the model)."""
        limits = [self.tokenizer.model_max_length] if self.tokenizer.model_max_length < 10**9 else []
        if self.record.get("max_position_embeddings"):
            limits.append(self.record["max_position_embeddings"])
        return min(limits) if limits else None


def load_export(folder: str | Path, *, device: str = "auto", compute_type: str = "default", threads: int | None = None,
                inter_threads: int = 1, translator=None) -> CTranslate2Export:
    """Load an export: its tokenizer and a ``ctranslate2.Translator`` on `device` (``auto``, ``cpu``, ``cuda``,
    ``cuda:N``) computing in `compute_type` (:func:`compute_type_of`), with `inter_threads` translators of
    `threads` CPU threads each (None: as many as PyTorch uses, which follows ``OMP_NUM_THREADS``; 0: CTranslate2's
    default); `translator` reuses a loaded one.

    Raises:
        ImportError: ctranslate2 is not installed, naming the extra that installs it.
        ValueError: a folder without CTranslate2's files or the tokenizer, a device CTranslate2 does not see, a
            compute type it does not run there.
    """
    ctranslate2 = import_ctranslate2()
    folder = Path(folder)
    missing = [name for name in CTRANSLATE2_FILES if not (folder / name).is_file()]
    if missing:
        raise ValueError(f"{folder} is not a whole CTranslate2 export: it has no {' and no '.join(missing)}; export "
                         "the model again with hf-headattn-export")
    if not (folder / TOKENIZER_FOLDER).is_dir():
        raise ValueError(f"{folder} is a CTranslate2 model without the {TOKENIZER_FOLDER}/ folder hf-headattn-export "
                         "writes beside it, so its text cannot be split into the model's pieces; export the model "
                         "with hf-headattn-export")
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(folder / TOKENIZER_FOLDER)
    if translator is None:
        name, index = ctranslate2_device(device)
        supported = ctranslate2.get_supported_compute_types(name, index)
        if compute_type not in ("default", "auto") and compute_type not in supported:
            raise ValueError(f"compute type {compute_type} (--dtype / --quantize) is not one CTranslate2 runs on "
                             f"{name}; there: {', '.join(sorted(supported))}")
        if threads is None:
            import torch

            threads = torch.get_num_threads()
        translator = ctranslate2.Translator(str(folder), device=name, device_index=index, compute_type=compute_type,
                                            inter_threads=inter_threads, intra_threads=threads)
    where = translator.device + (f":{translator.device_index[0]}" if translator.device == "cuda" else "")
    return CTranslate2Export(folder, translator, tokenizer, _read_record(folder), generation_defaults(folder), where,
                             translator.compute_type)


def export_batch_size(batch_size: int | str | None = AUTO_BATCH_SIZE) -> int | None:
    """The sentences a batch :func:`translate_export` queues: `batch_size` itself, or for ``"auto"``
    `DEFAULT_BATCH_SIZE`, the fast path's batch at beam 5 (CTranslate2 decodes every sentence of a batch to its own
    end, so its batches need no rows rule).

    Raises:
        ValueError: a string other than ``"auto"``.
    """
    return given_or_auto(batch_size, lambda: DEFAULT_BATCH_SIZE)


class ExportTranslator:
    """A loaded export as a translator (what :func:`~.translator.load_translator` returns for one): ``translate``
    gives what a model's translator gives (:class:`~.translator.ModelTranslator`), decoded by CTranslate2's
    ``Translator.translate_batch``."""

    backend = "ctranslate2"

    def __init__(self, export: CTranslate2Export):
        self.export = export
        self.tokenizer = export.tokenizer
        self.device = export.device

    def describe(self) -> dict:
        """What an evaluation records of the model (:meth:`CTranslate2Export.describe`)."""
        return self.export.describe()

    def fast(self, fast: bool | None = None) -> bool | None:
        """`fast` as given: CTranslate2's search decodes whatever it is (False is refused by ``translate``)."""
        return fast

    def batch_size(self, batch_size: int | str | None = AUTO_BATCH_SIZE, **_) -> int | None:
        """The sentences a batch: :func:`export_batch_size`."""
        return export_batch_size(batch_size)

    def settings(self, *, max_length: int | None = None, length_penalty: float | None = None, **_) -> dict:
        """How the search ranks and stops, as an evaluation records it: the overrides, else the export's."""
        return {"device": self.device,
                "max_length": self.export.generation["max_length"] if max_length is None else max_length,
                "length_penalty": self.export.generation["length_penalty"] if length_penalty is None
                else length_penalty,
                "early_stopping": True,  # CTranslate2's rule (num_beams finished hypotheses), whatever was asked
                "backend": self.backend, "compute_type": self.export.compute_type}

    def translate(self, sources: Sequence[str], *, nbest: int = 1, batch_size: int | str | None = AUTO_BATCH_SIZE,
                  max_tokens: int | None = DEFAULT_MAX_TOKENS, scores: bool = False, alignments: bool = False,
                  alignment_layer: int | None = None, alignment_heads: str = "mean", attention: bool = False,
                  strict: bool = False, fast: bool | None = None, seed: int | None = None, progress: bool = False,
                  desc: str = "translating", ctranslate2_options: dict | None = None,
                  **generation) -> list[Translation]:
        """One :class:`~.results.Translation` per source, in input order (the arguments of
        :meth:`~.translator.ModelTranslator.translate`; `generation` are :data:`GENERATION_OPTIONS` and
        ``max_length``, None leaving the export's default; `seed` seeds CTranslate2's sampling;
        `ctranslate2_options` go to ``Translator.translate_batch`` as they are).

        Raises:
            OptionRefused: an option CTranslate2 has no counterpart of or the export cannot honour
                (:func:`export_refusals`), ``nbest`` above the beams.
            ValueError: a too-long source with ``strict``.
        """
        generation = {name: value for name, value in generation.items() if value is not None}
        early_stopping, coverage_penalty = generation.pop("early_stopping", None), generation.pop("coverage_penalty", 0)
        settings = self._settings(generation)
        check_nbest(nbest, settings["num_beams"], lead=f"{self.export.folder}: ")
        check_export_options(self.export.folder, fast=fast, attention=attention, alignments=alignments,
                             alignment_layer=alignment_layer, alignment_heads=alignment_heads,
                             coverage_penalty=coverage_penalty, do_sample=settings["do_sample"],
                             num_beams=settings["num_beams"], early_stopping=early_stopping)
        options = {**_search_options(settings, nbest, alignments), **(ctranslate2_options or {})}
        if settings["do_sample"] and seed is not None:
            import_ctranslate2().set_random_seed(seed)
        sources = list(sources)
        planned = source_batches(self.tokenizer, sources, self.export.source_token_limit(),
                                 export_batch_size(batch_size), max_tokens, strict=strict)
        results = self._decode(planned, sources, settings, options, alignments=alignments,
                               scores=scores or nbest > 1, progress=progress, desc=desc)
        return [Translation(source, results.get(index, [])) for index, source in enumerate(sources)]

    def _settings(self, generation: dict) -> dict:
        """The export's decoding defaults with `generation` over them (``max_length`` as ``max_new_tokens``)."""
        accepted = (*GENERATION_OPTIONS, "max_length")
        refuse(f"{self.export.folder}: ", [
            Refusal(name, generation[name], f"no CTranslate2 counterpart; accepted: {', '.join(accepted)}")
            for name in sorted(set(generation) - set(accepted))])
        settings = {**self.export.generation, **generation}
        if "max_length" in generation and "max_new_tokens" not in generation:  # counting the start token
            settings["max_new_tokens"] = max(generation["max_length"] - 1, 1)
        return settings

    def _decode(self, planned, sources, settings, options, *, alignments, scores, progress,
                desc) -> dict[int, list[Hypothesis]]:
        """Each planned batch translated: source position -> hypotheses."""
        from ..progress import Progress

        tokenizer, translator, limit = self.tokenizer, self.export.translator, self.export.source_token_limit()
        texts = [sources[index] for index in planned.kept]
        encoded = planned.input_ids
        if limit is not None and any(len(ids) > limit for ids in encoded):  # cut as the tokenizer cuts (keeping </s>)
            encoded = tokenizer(texts, return_token_type_ids=False, verbose=False, truncation=True,
                                max_length=limit)["input_ids"]
        pieces = dict(zip(planned.kept, (tokenizer.convert_ids_to_tokens(ids) for ids in encoded)))
        source_words = dict(zip(planned.kept, source_word_indices(tokenizer, texts, encoded, limit))) \
            if alignments else {}
        # every batch queued at once, so that inter_threads translators take them in parallel; read back in order
        queued = [(batch, translator.translate_batch([pieces[index] for index in batch], asynchronous=True, **options),
                   queue_first_step_attention(translator, [pieces[index] for index in batch]) if alignments else None)
                  for batch in planned.batches]
        results: dict[int, list[Hypothesis]] = {}
        bar = Progress(total=len(planned.kept), desc=desc, unit="sentence", disable=not progress)
        for batch, pending, first_steps in queued:
            outputs = [item.result() for item in pending]
            first_rows = [item.result().attention[0][0] for item in first_steps] if alignments else None
            hypotheses = _hypotheses(self.export, batch, outputs, first_rows, pieces, source_words, settings,
                                     scores=scores)
            results.update(zip(batch, ranked(hypotheses) if scores else hypotheses))
            bar.update(len(batch))
        bar.close()
        return results


def _search_options(settings: dict, nbest: int, alignments: bool) -> dict:
    """``Translator.translate_batch``'s options for the decoding `settings` (generate's names)."""
    options = {"beam_size": settings["num_beams"], "num_hypotheses": nbest,
               "max_decoding_length": settings["max_new_tokens"],
               "min_decoding_length": settings["min_new_tokens"],  # CTranslate2's default, 1, forbids an empty one
               "length_penalty": settings["length_penalty"], "no_repeat_ngram_size": settings["no_repeat_ngram_size"],
               "max_input_length": 0, "return_end_token": True, "return_scores": True,
               "return_attention": alignments}
    if settings["do_sample"]:
        options.update(sampling_topk=settings["top_k"] or 0, sampling_topp=settings["top_p"],
                       sampling_temperature=settings["temperature"])
    return options


def queue_first_step_attention(translator, pieces: list[list[str]]):
    """The first decoding step's attention of each source, from a one-step greedy pass (queued, asynchronous).

    Why: CTranslate2 4.x's beam search returns the first step's attention of a padded batch wrongly (rows of other
    sentences of the batch), while its greedy search gets that step right. The first step reads the decoder's start
    token alone, whatever the search, so a one-step greedy pass computes the attention beam search used; the
    alignment takes that row in place of the beam search's (:func:`_with_first_step`).
    """
    return translator.translate_batch(pieces, asynchronous=True, beam_size=1, max_decoding_length=1,
                                      max_input_length=0, return_attention=True)


def _with_first_step(first_row: list[float], rows: list[list[float]]) -> list[list[float]]:
    """A hypothesis' attention rows with the first step's from :func:`queue_first_step_attention`."""
    return [first_row, *rows[1:]]


def translate_export(export: CTranslate2Export | str | Path, sources: Sequence[str], **options) -> list[Translation]:
    """Translate `sources` with an export (loaded, or its folder): :meth:`ExportTranslator.translate`."""
    if not isinstance(export, CTranslate2Export):
        export = load_export(export)
    return ExportTranslator(export).translate(sources, **options)


def _hypotheses(export, batch, outputs, first_rows, pieces, source_words, settings, *, scores):
    """Each sentence's hypotheses: text, score and (with `first_rows`, the first step's attention) alignment."""
    tokenizer = export.tokenizer
    eos = tokenizer.eos_token
    grouped, targets = [], []
    for position, (index, output) in enumerate(zip(batch, outputs)):
        group = []
        for k, tokens in enumerate(output.hypotheses):
            ended = bool(tokens) and tokens[-1] == eos
            ids = tokenizer.convert_tokens_to_ids(tokens)  # through the end of sentence, as the model produced them
            text = tokenizer.decode(ids, skip_special_tokens=True).replace("\n", " ").strip()
            hypothesis = Hypothesis(text, score=output.scores[k] if scores else None)
            if first_rows is not None:
                import torch

                rows = output.attention[k]  # [target tokens, source tokens], the end of sentence's included
                hypothesis.alignment = pharaoh(torch.tensor(_with_first_step(first_rows[position], rows)),
                                               source_words[index], decoded_word_indices(tokenizer, ids)) \
                    if rows else ""
            group.append(hypothesis)
            targets.append((index, tokens[:-1] if ended else tokens, ended, hypothesis))
        grouped.append(group)
    if scores and settings["do_sample"]:
        _score_sampled(export, pieces, targets, settings["length_penalty"])
    return grouped


def _score_sampled(export, pieces, targets, length_penalty) -> None:
    """Sampled hypotheses' scores: the model's log-probabilities (``score_batch``), not the sampling distribution's."""
    sampled = export.translator.score_batch([pieces[index] for index, *_ in targets],
                                            [tokens for _, tokens, *_ in targets], max_input_length=0)
    for (_, tokens, ended, hypothesis), result in zip(targets, sampled):
        log_probs = result.log_probs if ended else result.log_probs[:-1]  # score_batch adds the end of sentence
        hypothesis.score = sum(log_probs) / max(len(log_probs), 1) ** length_penalty
