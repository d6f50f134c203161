r"""Exporting a model to where deployed Marian models run: CTranslate2 (:func:`export_ctranslate2`), and translating
with the exported folder (:func:`translate_with_ctranslate2`). The command is :mod:`hf_headattn.commands.export`
(``hf-headattn-export``).

A softmax model with Marian's settings is a `MarianMTModel` (`HeadAttnForConditionalGeneration.to_marian`, the
same logits), and CTranslate2 converts `MarianMTModel`s with its own Transformers converter. Its Marian loader is
written for OPUS-MT's vocabulary layout, where `<pad>` is the last token, unused after conversion, and the decoder
starts from a zero vector. This package's tokenizers put `<pad>` first (id 0) and its decoder starts from `<pad>`'s
trained embedding, so the export keeps every token and starts the decoder from `<pad>` (CTranslate2's
`decoder_start_token`): CTranslate2 then computes what the model computes, up to its kernels' rounding.

The output folder holds CTranslate2's `model.bin`, `config.json` and vocabulary, plus the model's tokenizer (its
files, so that text is split into the same pieces), its `generation_config.json` (the decoding defaults) and
`hf_headattn_export.json` (what was exported from where, the model's type, parameters and longest source, and the
decoder layer whose attention CTranslate2 returns). CTranslate2's decoder returns the mean of that layer's heads
(`alignment_heads`), as this package's alignments read it; for a model trained with guided alignment, the mean of its
guided heads at its guided layer, which the export moves to the front of that layer (CTranslate2 averages the first
`alignment_heads` heads; moving a head's query, key and value rows and output columns together changes nothing
else). The folder is written as a transaction
(`output_files.new_folder`): an interrupted export leaves no half-written folder, and ``--overwrite`` replaces only
an earlier export, never the model's folder or one that holds it. Translating with it:
:mod:`hf_headattn.translation.ctranslate2_backend` (what `hf-headattn-translate` and `hf-headattn-evaluate` run when
`--model` is an export).

Variants CTranslate2 has no kernel for (sparsemax, entmax15, entmax_alpha, csoftmax, csparsemax, MMA's masks, DHICM,
multi-hop, the LSTM family) are refused naming the variant and the site; they run with `hf-headattn-translate` (its
fast path and `--quantize int8`). ONNX: not exported; see docs/deploying.md for why.

Tooling, not model runtime: never copied into a checkpoint.
"""

from __future__ import annotations

import json
from pathlib import Path

from .output_files import check_output_folder, new_folder
from .translation.ctranslate2_backend import EXPORT_RECORD, TOKENIZER_FOLDER, ExportTranslator, load_export
from .translation.ctranslate2_backend import import_ctranslate2 as _import_ctranslate2

__all__ = ["CTRANSLATE2_QUANTIZATIONS", "FORMATS", "export_ctranslate2", "import_ctranslate2",
           "translate_with_ctranslate2"]

FORMATS = ("ctranslate2",)
# CTranslate2's weight types (`ct2-transformers-converter --quantization`); "float32" keeps the weights as they are
CTRANSLATE2_QUANTIZATIONS = ("float32", "int8", "int8_float32", "int8_float16", "int8_bfloat16", "int16", "float16",
                             "bfloat16")
EXPORT_COMMAND = "hf-headattn-export"


def import_ctranslate2():
    """(ctranslate2, its Transformers converters module).

    Raises:
        ImportError: ctranslate2 is not installed, naming the extra that installs it.
    """
    ctranslate2 = _import_ctranslate2("Exporting to CTranslate2")
    from ctranslate2.converters import transformers as converters

    return ctranslate2, converters


def exported_alignment(config) -> dict:
    """The cross-attention CTranslate2's `return_attention` gives for a model of `config`, as the export records it:
    the mean of the guided heads at the guided layer (guided alignment), else the mean of the last layer's heads;
    `full_context` when the model's alignments come with full target context, which the export cannot give."""
    layers = config.decoder_layers
    guided = config.guided_alignment()
    if guided is None:
        return {"layer": layers - 1, "layers": layers, "heads": "mean"}
    layer, heads = guided
    alignment = {"layer": layer, "layers": layers, "heads": "guided", "guided_heads": heads}
    if getattr(config, "guided_alignment_full_context", False):  # read from a pass CTranslate2 does not run
        alignment["full_context"] = True
    return alignment


def move_heads_first(attention, heads: list[int]) -> None:
    """Reorder the heads of a Marian attention module in place so that `heads` come first, the others after in
    their order: each head's rows of the query, key and value projections and its columns of the output projection
    move together, so the module computes what it computed."""
    num_heads = attention.num_heads
    order = [*heads, *(head for head in range(num_heads) if head not in heads)]
    head_dim = attention.head_dim
    rows = [head * head_dim + offset for head in order for offset in range(head_dim)]
    for projection in (attention.q_proj, attention.k_proj, attention.v_proj):
        projection.weight.data = projection.weight.data[rows]
        projection.bias.data = projection.bias.data[rows]
    attention.out_proj.weight.data = attention.out_proj.weight.data[:, rows]


def _marian_loader_class(converters, alignment: dict):
    """CTranslate2's Marian loader, for a vocabulary whose `<pad>` may sit anywhere and whose decoder starts from
    `<pad>`'s embedding, returning the attention `alignment` (`exported_alignment`) describes."""

    class PadKeepingMarianLoader(converters.MarianMTLoader):
        def get_model_spec(self, model):
            model.config.normalize_before = False
            model.config.normalize_embedding = False
            spec = converters.BartLoader.get_model_spec(self, model)  # all rows kept: <pad> is a real id here
            # the attention CTranslate2 returns (return_attention): the mean of the first `alignment_heads` heads of
            # `alignment_layer`, by default only the first head of the last layer
            heads = (len(alignment["guided_heads"]) if alignment["heads"] == "guided"
                     else model.config.decoder_attention_heads)
            spec.decoder.alignment_layer = type(spec.decoder.alignment_layer)(alignment["layer"])
            spec.decoder.alignment_heads = type(spec.decoder.alignment_heads)(heads)
            return spec

        def set_config(self, config, model, tokenizer):
            super().set_config(config, model, tokenizer)
            config.decoder_start_token = tokenizer.convert_ids_to_tokens(model.config.decoder_start_token_id)

        def set_decoder(self, spec, decoder):
            converters.BartLoader.set_decoder(self, spec, decoder)  # from <pad>'s embedding, not a zero vector

        def get_vocabulary(self, model, tokenizer):
            return converters.BartLoader.get_vocabulary(self, model, tokenizer)

    return PadKeepingMarianLoader


def export_ctranslate2(model, tokenizer, output_dir: str | Path, *, quantization: str = "float32",
                       overwrite: bool = False, source: str | None = None) -> Path:
    """Write `model` (a softmax `HeadAttnForConditionalGeneration` with Marian's settings) as a CTranslate2 model
    folder, through `to_marian` and CTranslate2's own converter; returns the folder.

    Raises:
        ValueError: a variant or setting Marian cannot express (from `to_marian`, naming the variant and the site),
            an unknown quantization, or a folder that exists without `overwrite`, or is the model's own.
        ImportError: ctranslate2 is not installed (naming the extra that installs it).
    """
    if quantization not in CTRANSLATE2_QUANTIZATIONS:
        raise ValueError(f"Unknown quantization {quantization!r}; accepted: {', '.join(CTRANSLATE2_QUANTIZATIONS)}")
    output_dir = Path(output_dir)
    inputs = [source] if source is not None and Path(source).exists() else []
    check_output_folder(output_dir, command=EXPORT_COMMAND, overwrite=overwrite, inputs=inputs)
    if not hasattr(model, "to_marian"):
        raise ValueError(f"{type(model).__name__} cannot be exported to CTranslate2: only softmax Transformer models "
                         "of this package (HeadAttnForConditionalGeneration) become MarianMTModels; the LSTM family "
                         "has no CTranslate2 architecture")
    marian = model.to_marian().float()  # raises naming the variant and site CTranslate2 cannot run
    _, converters = import_ctranslate2()
    from ctranslate2.converters.converter import Converter

    alignment = exported_alignment(model.config)
    if alignment["heads"] == "guided":
        move_heads_first(marian.model.decoder.layers[alignment["layer"]].encoder_attn, alignment["guided_heads"])
    loader_class = _marian_loader_class(converters, alignment)

    class InMemoryConverter(Converter):  # CTranslate2's conversion (validate, quantize, save) of a loaded model
        def _load(self):
            return loader_class()(marian, tokenizer)

    with new_folder(output_dir, command=EXPORT_COMMAND, overwrite=overwrite, inputs=inputs) as staging:
        InMemoryConverter().convert(str(staging), quantization=None if quantization == "float32" else quantization,
                                    force=True)
        tokenizer.save_pretrained(staging / TOKENIZER_FOLDER)
        model.generation_config.save_pretrained(staging)
        (staging / EXPORT_RECORD).write_text(json.dumps({
            "format": "ctranslate2", "source": source, "quantization": quantization,
            "architecture": "MarianMTModel (HeadAttnForConditionalGeneration.to_marian)",
            "model_type": model.config.model_type,
            "parameters": sum(parameter.numel() for parameter in model.parameters()),
            "max_position_embeddings": marian.config.max_position_embeddings,
            "decoder_start_token": tokenizer.convert_ids_to_tokens(model.config.decoder_start_token_id),
            "alignment": alignment,
        }, indent=2) + "\n")
    return output_dir


def translate_with_ctranslate2(model_dir: str | Path, sources: list[str], *, beam_size: int = 1,
                               max_decoding_length: int = 256, batch_size: int = 32, device: str = "cpu",
                               compute_type: str = "default", inter_threads: int = 1, intra_threads: int = 0,
                               translator=None, **translate_options) -> list[str]:
    """Translate `sources` with an exported CTranslate2 folder, the best translation's text of each (blank lines
    translate to blank lines): the export's translator
    (:class:`hf_headattn.translation.ctranslate2_backend.ExportTranslator`, what
    :func:`hf_headattn.translation.load_translator` returns for it) in batches of `batch_size` sentences sorted by
    length. `translate_options` go to `Translator.translate_batch` (e.g. ``length_penalty``,
    ``no_repeat_ngram_size``); `translator` reuses a loaded `ctranslate2.Translator`."""
    export = load_export(model_dir, device=device, compute_type=compute_type, threads=intra_threads,
                         inter_threads=inter_threads, translator=translator)
    translations = ExportTranslator(export).translate(sources, num_beams=beam_size, max_new_tokens=max_decoding_length,
                                                      batch_size=batch_size, max_tokens=None,
                                                      ctranslate2_options=translate_options)
    return [translation.text for translation in translations]
