"""One translator for a model and for its CTranslate2 export: :func:`load_translator` loads either (device, dtype,
int8 quantization, the tokenizer) and returns an object whose ``translate(sources, **options)`` gives the same
:class:`~.results.Translation` results, as sockeye's ``inference.Translator`` (built once, inputs through it) and
CTranslate2's ``Translator.translate_batch`` do:

* :class:`ModelTranslator` — a model and its tokenizer, decoded by :func:`~.sentences.translate` (the fast path or
  ``generate``: ``fast=None`` chooses by device, :func:`~.sentences.fast_path_by_default`);
* :class:`~.ctranslate2_backend.ExportTranslator` — an export, decoded by CTranslate2.

Both take the same ``translate`` options (``nbest``, ``batch_size``, ``max_tokens``, ``scores``, ``alignments``,
``alignment_layer``, ``alignment_heads``, ``attention``, ``strict``, ``fast``, ``seed``, ``progress``, ``desc`` and
``generate``'s decoding options, None leaving the default), and both refuse what they cannot honour with one error,
:class:`~.refusals.OptionRefused` (each option and the reason), before anything is translated;
:func:`check_options` refuses an export's before anything is loaded. A command words the error with its flags
(``error.spelled(FLAG_SPELLING)``, :mod:`hf_headattn.cli`). ``describe``, ``batch_size`` and ``settings`` say what an
evaluation records.

Tooling, not model runtime: never copied into a checkpoint.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from pathlib import Path

from .batches import AUTO_BATCH_SIZE, DEFAULT_MAX_TOKENS
from .ctranslate2_backend import (CTranslate2Export, ExportTranslator, check_export_options, compute_type_of,
                                  export_lead, export_refusals, find_export, import_ctranslate2, load_export)
from .quantization import QUANTIZATIONS, quantize as quantize_model
from .refusals import OptionRefused, Refusal, refuse
from .results import Translation
from .sentences import check_nbest, distributed_state, fast_path_by_default, resolve_batch_size, translate

# torch, Transformers and the models are imported where they are used, so that the commands' `--help` is instant.

__all__ = ["DTYPES", "ExportTranslator", "ModelTranslator", "OptionRefused", "Refusal", "check_options",
           "load_translator"]

DTYPES = ("auto", "float32", "float16", "bfloat16")


class ModelTranslator:
    """A model and its tokenizer as a translator (what :func:`load_translator` returns for a model folder, a Hub id
    or a loaded model); `name` says it in refusals (default: the model's class)."""

    backend = "model"

    def __init__(self, model, tokenizer, name: str | Path | None = None):
        self.model, self.tokenizer = model, tokenizer
        self.name = str(name) if name is not None else type(model).__name__

    @property
    def device(self):
        return self.model.device

    def describe(self) -> dict:
        """What an evaluation records of the model: path and name (of a folder), type, class and parameters."""
        path = Path(self.name)
        return {"path": str(path.resolve()), "name": path.resolve().name, "model_type": self.model.config.model_type,
                "architecture": type(self.model).__name__,
                "parameters": sum(parameter.numel() for parameter in self.model.parameters())}

    def fast(self, fast: bool | None = None) -> bool:
        """Whether ``translate`` decodes through the fast path: `fast`, or for None the device's default."""
        return fast_path_by_default(self.device) if fast is None else fast

    def batch_size(self, batch_size: int | str | None = AUTO_BATCH_SIZE, *, fast: bool | None = None,
                   **generation) -> int | None:
        """The sentences a batch ``translate`` decodes with these options (:func:`~.sentences.resolve_batch_size`)."""
        return resolve_batch_size(self.model, batch_size, fast=self.fast(fast), **_given(generation))

    def settings(self, **generation) -> dict:
        """How the search ranks and stops with these options, as an evaluation records it: the options, else the
        model's generation config, else ``generate``'s defaults."""
        from ..decoding import resolve_generation_config

        searched = resolve_generation_config(self.model, **_given({name: generation.get(name) for name in (
            "num_beams", "max_length", "length_penalty", "early_stopping")}))[0]
        return {"device": str(self.device), "max_length": searched.max_length,
                "length_penalty": searched.length_penalty, "early_stopping": searched.early_stopping}

    def refusals(self, *, num_beams: int | None = None, early_stopping=None, coverage_penalty=None,
                 **_) -> list[Refusal]:
        """The options this model cannot honour: a coverage penalty its ``generate`` lacks, early stopping with
        greedy search."""
        refusals = []
        if coverage_penalty and "coverage_penalty" not in inspect.signature(self.model.generate).parameters:
            refusals.append(Refusal("coverage_penalty", coverage_penalty, f"{self.name} is a "
                                    f"{self.model.config.model_type} model, whose generate has no coverage penalty "
                                    "(the LSTM family's has)", shape="{option}: {reason}"))
        beams = num_beams or self.model.generation_config.num_beams or 1
        if early_stopping is not None and beams == 1:
            refusals.append(Refusal("early_stopping", early_stopping, "pass {num_beams} 2 or more",
                                    shape="{option} ends beam search; the model decodes greedily (num_beams 1): "
                                          "{reason}"))
        return refusals

    def translate(self, sources: Sequence[str], *, nbest: int = 1, fast: bool | None = None, seed: int | None = None,
                  batch_size: int | str | None = AUTO_BATCH_SIZE, max_tokens: int | None = DEFAULT_MAX_TOKENS,
                  **options) -> list[Translation]:
        """One :class:`~.results.Translation` per source, in input order: :func:`~.sentences.translate` (its
        options; `fast` None: the device's default; `seed` seeds sampling; decoding options that are None keep the
        model's generation config).

        Raises:
            OptionRefused: ``nbest`` above the beams, an option the model cannot honour (:meth:`refusals`).
            ValueError: what :func:`~.sentences.translate` refuses.
        """
        options = _given(options)
        if not options.get("coverage_penalty", True):  # 0: none (generate of the Transformer has no such argument)
            del options["coverage_penalty"]
        check_nbest(nbest, options.get("num_beams") or self.model.generation_config.num_beams or 1,
                    lead=f"{self.name}: ")
        refuse(f"{self.name}: ", self.refusals(**options))
        if seed is not None:
            from transformers import set_seed

            set_seed(seed)
        return translate(self.model, self.tokenizer, sources, nbest=nbest, fast=self.fast(fast),
                         batch_size=batch_size, max_tokens=max_tokens, **options)


def _given(options: dict) -> dict:
    """`options` without those left None (the default: the model's or export's generation config)."""
    return {name: value for name, value in options.items() if value is not None}


def check_options(model_or_export, **options) -> None:
    """Refuse, before anything is loaded, the options an export cannot honour (:func:`export_refusals`; a model's
    are refused once it is loaded); a folder that is neither a model nor an export is refused too.

    Raises:
        OptionRefused: naming the export and each option, with the reason.
        ValueError: a local folder that is neither a saved model nor an export.
        ImportError: an export without ctranslate2 installed.
    """
    folder = model_or_export.folder if isinstance(model_or_export, CTranslate2Export) else (
        find_export(model_or_export) if isinstance(model_or_export, (str, Path)) else None)
    if folder is not None:
        check_export_options(folder, **options)
        import_ctranslate2()


def load_translator(model_or_export, *, device: str = "auto", dtype: str = "auto", quantize: str = "none",
                    tokenizer=None, trust_remote_code: bool = False, force: bool = False, threads: int | None = None,
                    inter_threads: int = 1) -> ModelTranslator | ExportTranslator:
    """The translator of a model folder, a Hub id, a loaded model (with its `tokenizer`), or a CTranslate2 export
    (its folder, recognised by its files: :func:`find_export`, or a loaded :class:`CTranslate2Export`).

    Args:
        device: ``auto`` (CUDA when there is one; under torchrun each process's), ``cpu``, ``cuda``, ``cuda:N``.
        dtype: The weights' type: ``auto`` (as saved), ``float32``, ``float16``, ``bfloat16``; for an export with
            `quantize`, CTranslate2's compute type (:func:`compute_type_of`).
        quantize: ``none`` or ``int8`` (a model: dynamic quantization, CPU only; an export: int8 compute).
        tokenizer: For a folder or Hub id, another tokenizer than the model's own (refused unless the model was
            trained with it, or warned about with `force`; an export refuses it); for a loaded model, its tokenizer.
        trust_remote_code: Run a Hub repository's code (:func:`hf_headattn.loading.load_model_and_tokenizer`).
        threads, inter_threads: An export's CPU threads per translator (None: PyTorch's) and translators.

    Raises:
        OptionRefused: an option the model or export cannot honour (int8 off the CPU, an export's tokenizer, an
            export under several processes).
        ValueError, OSError: what cannot be loaded; ImportError: an export without ctranslate2 installed.
    """
    if dtype not in DTYPES:
        raise ValueError(f"Unknown dtype={dtype!r}; accepted: {', '.join(DTYPES)}")
    if quantize not in QUANTIZATIONS:
        raise ValueError(f"Unknown quantize={quantize!r}; accepted: {', '.join(QUANTIZATIONS)}")
    export = model_or_export if isinstance(model_or_export, CTranslate2Export) else (
        find_export(model_or_export) if isinstance(model_or_export, (str, Path)) else None)
    if export is not None:
        return _load_export_translator(export, device=device, dtype=dtype, quantize=quantize, tokenizer=tokenizer,
                                       threads=threads, inter_threads=inter_threads)
    return _load_model_translator(model_or_export, device=device, dtype=dtype, quantize=quantize,
                                  tokenizer=tokenizer, trust_remote_code=trust_remote_code, force=force)


def _load_export_translator(export, *, device, dtype, quantize, tokenizer, threads, inter_threads) -> ExportTranslator:
    folder = export.folder if isinstance(export, CTranslate2Export) else export
    refuse(export_lead(folder), export_refusals(folder, tokenizer=tokenizer,
                                                distributed=distributed_state() is not None))
    if not isinstance(export, CTranslate2Export):
        import_ctranslate2()
        export = load_export(folder, device=device, compute_type=compute_type_of(dtype, quantize), threads=threads,
                             inter_threads=inter_threads)
    return ExportTranslator(export)


def _load_model_translator(model, *, device, dtype, quantize, tokenizer, trust_remote_code,
                           force) -> ModelTranslator:
    from ..loading import load_model_and_tokenizer, resolve_device

    state = distributed_state()
    place = state.device if state is not None and device == "auto" else resolve_device(device)
    name = model if isinstance(model, (str, Path)) else None
    if quantize != "none" and place.type != "cpu":
        raise OptionRefused(f"{name or type(model).__name__}: ", [Refusal(
            "quantize", quantize, "int8 dynamic quantization runs on the CPU; use {device} cpu (on " + str(place)
            + ", use {dtype} float16 or bfloat16)")])
    if name is not None:
        import torch

        model, tokenizer = load_model_and_tokenizer(
            model, trust_remote_code=trust_remote_code, tokenizer=tokenizer, force=force,
            dtype="auto" if dtype == "auto" else getattr(torch, dtype))
    elif tokenizer is None:
        raise ValueError("A loaded model translates with its tokenizer: pass tokenizer=")
    elif dtype != "auto":
        import torch

        model.to(getattr(torch, dtype))
    model.to(place)
    if quantize != "none":
        model = quantize_model(model, quantize)
    return ModelTranslator(model, tokenizer, name)
