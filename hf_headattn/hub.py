r"""Model cards and Hub upload for saved model folders.

    # fill the family's card template from an evaluation JSON into <model>/README.md
    hf-headattn-hub card --model runs/de-en --evaluation runs/de-en/eval/test_2016_flickr.beam4.metrics.json \
        --dataset_name "Multi30k (task 1)" --dataset_id bentrevett/multi30k --language de en --repo_id user/de-en
    # check the folder is complete, then upload model, tokenizer, code, pipeline and card in one commit
    hf-headattn-hub push --model runs/de-en --repo_id user/de-en [--private]
    # a Gradio Space running the web demo (hf_headattn.app) on one or more models, and its upload
    hf-headattn-hub space --model runs/de-en --model runs/de-en-csparsemax --output_dir runs/space
    hf-headattn-hub push --space runs/space --repo_id user/de-en-demo

* :func:`write_model_card` picks the template of the folder's model family (``hf_headattn/model_cards/transformer.md``
  for ``model_type = "headattn"``, ``hf_headattn/model_cards/rnn.md`` for ``"headattn_rnn"``), describes the configured
  attention variants from the config, and fills in the measured numbers of an evaluation JSON
  (:func:`hf_headattn.evaluation.evaluate_model`) as a results table and as ``model-index`` metadata, which
  the Hub shows as evaluation results and which ``huggingface_hub`` parses back
  (``ModelCard.load``, ``model_index_to_eval_results``).
* :func:`check_model_folder` lists what an upload needs and is missing; :func:`push_to_hub` runs it, then
  ``HfApi.create_repo`` and ``HfApi.upload_folder``. Only what a user of the model needs goes up
  (:func:`files_to_upload`: config, safetensors weights, the code the config names and what it imports,
  tokenizer, card, train_results.json); every other file of the folder is named in a warning
  (:func:`files_left_out`). Pickle weights (``pytorch_model.bin``) are refused: loading them can run arbitrary
  code, and ``save_pretrained`` writes safetensors. Only regular files inside the folder go up: a symbolic link
  out of it is never followed (one the model needs is refused), and uploaded files that look like they hold a
  secret (an access token, a private key) are warned about (:func:`secrets_in`). A repository id is validated
  before it is written into a card or sent anywhere.
* :func:`write_space` writes a Gradio Space folder that runs the web demo (:mod:`hf_headattn.app`) on model folders
  (copied in, their :func:`files_to_upload`) or Hub ids, with the demo's modules copied into the Space, so that it
  runs with torch, Transformers and gradio alone; :func:`check_space_folder` and :func:`push_space` check and upload
  it as a Space (``repo_type="space"``, gradio SDK).

Tooling, not model runtime: never copied into a checkpoint.
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import re
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path

from huggingface_hub import EvalResult, HfApi, ModelCard, ModelCardData
from huggingface_hub.hf_api import DEFAULT_IGNORE_PATTERNS
from huggingface_hub.utils import filter_repo_objects, validate_repo_id

from .cli import HelpFormatter, UnderscoreArgumentParser, add_verbose_argument, configure_logging
from .output_files import staging_folder

# transformers and the model classes are imported where they are used, so that `--help` is instant.


__all__ = [
    "CARD_METRICS",
    "TEMPLATES",
    "TEMPLATES_DIR",
    "UPLOADED_FILES",
    "check_model_folder",
    "check_space_folder",
    "files_left_out",
    "files_to_upload",
    "links_out_of",
    "main",
    "push_space",
    "push_to_hub",
    "secrets_in",
    "write_model_card",
    "write_space",
]

# The card templates are package data (pyproject.toml), so a wheel install has them too.
TEMPLATES_DIR = Path(__file__).resolve().with_name("model_cards")
TEMPLATES = {"headattn": "transformer.md", "headattn_rnn": "rnn.md"}

# Evaluation JSON key -> name shown on the card and in model-index; lower is better for the last three.
CARD_METRICS = {"bleu": "BLEU", "chrf": "chrF", "ter": "TER", "rep": "REP", "drop": "DROP"}
_HUB_METRIC_IDS = ("bleu", "chrf", "ter")  # the ones the Hub knows as metrics (REP and DROP are this project's)

WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json")
# Pickle formats (torch.save): loading them runs whatever they hold, so they are never uploaded, and a folder whose
# only weights are pickled is refused.
PICKLE_WEIGHT_FILES = ("pytorch_model.bin", "pytorch_model.bin.index.json")
TOKENIZER_VOCAB_FILES = ("tokenizer.json", "source.spm", "spiece.model", "sentencepiece.bpe.model", "vocab.json")
# What goes up, at the folder's top level, besides the weights' shards and the code files the config needs: model
# and generation config, tokenizer (this package's tokenizer.json, or a Marian one's sentencepiece models and
# vocabulary), card, and the training command's train_results.json (its numbers). Everything else stays home:
# Trainer's byproducts quietly (TRAINER_BYPRODUCTS), notes and stray files with a warning that names them.
UPLOADED_FILES = (
    "config.json", "generation_config.json", *WEIGHT_FILES, *TOKENIZER_VOCAB_FILES, "target.spm",
    "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json", "README.md", "train_results.json",
)

# The training command writes these into the output folder (checkpoints only with --keep_checkpoints); no model
# user needs them, and run_manifest.json names the training files by their paths on this machine.
TRAINER_BYPRODUCTS = ("training_args.bin", "checkpoint-*", "run_manifest.json")

_LANGUAGE_NAMES = {"be": "Belarusian", "cs": "Czech", "de": "German", "en": "English", "es": "Spanish",
                   "fr": "French", "hi": "Hindi", "it": "Italian", "ja": "Japanese", "ro": "Romanian",
                   "ru": "Russian", "zh": "Chinese"}

_PAPERS = {
    "transformer": "Vaswani et al. (2017), *Attention Is All You Need*: the Transformer; the layout (post-LN, "
                   "sinusoidal positions, final logits bias) follows Marian (Junczys-Dowmunt et al., 2018).",
    "dhicm": "Goindani & Shrivastava (2021), *A Dynamic Head Importance Computation Mechanism for Neural Machine "
             "Translation*: `dhicm`, a second-level attention over the heads' outputs with a KL term that keeps "
             "the head importances from being uniform.",
    "mma": "Cui, Iida, Hung, Utsuro & Nagata (2019), *Mixed Multi-Head Self-Attention for Neural Machine "
           "Translation*: `mma`, heads with global, local, forward and backward hard masks.",
    "multihop": "Iida, Kimura, Cui, Hung, Utsuro & Nagata (2019), *A Multi-Hop Attention for RNN based Neural "
                "Machine Translation*: multi-head source attention and second-level hops over the heads.",
    "sparse": "Malaviya, Ferreira & Martins (2018), *Sparse and Constrained Attention for Neural Machine "
              "Translation*: sparsemax, constrained softmax and constrained sparsemax attention with fertility "
              "bounds, and the REP and DROP metrics.",
    "luong": "Luong, Pham & Manning (2015), *Effective Approaches to Attention-based Neural Machine Translation*: "
             "the attentional LSTM encoder-decoder with input feeding.",
    "coverage_vector": "Tu, Lu, Liu, Liu & Li (2016), *Modeling Coverage for Neural Machine Translation*: the "
                       "coverage vector.",
}
_VARIANT_PAPERS = {"dhicm": "dhicm", "mma": "mma", "multihop": "multihop", "sparsemax": "sparse",
                   "csoftmax": "sparse", "csparsemax": "sparse"}
_SITE_NAMES = {"encoder_self_attention": "Encoder self-attention", "decoder_self_attention": "Decoder self-attention",
               "cross_attention": "Cross-attention"}
_FERTILITY = {"constant": "CONSTANT (every source token may receive {constant_fertility:g} units of attention)",
              "guided": "GUIDED (per token, the largest fertility in word alignments of the training data)",
              "predicted": "PREDICTED (a bi-LSTM tagger inside the model, trained on word-alignment fertilities)"}

_REQUIRED_EVALUATION_KEYS = ("bleu", "chrf", "ter", "bleu_by_length", "model", "test_set", "decoding", "examples")


# ------------------------------------------------------------------------------------------------ model card
def write_model_card(
    model_dir: str | Path,
    evaluation: str | Path | Mapping,
    *,
    dataset_name: str,
    dataset_id: str | None = None,
    dataset_config: str | None = None,
    language: Sequence[str] = ("de", "en"),
    repo_id: str | None = None,
    model_name: str | None = None,
    license: str | None = None,
    training_data: str | None = None,
    limitations: Sequence[str] = (),
    template: str | Path | None = None,
) -> Path:
    """Fill the family's card template into ``model_dir/README.md`` (overwriting it) and return that path.

    Args:
        model_dir: A saved model folder (its config.json decides the family and is described on the card).
        evaluation: The JSON file (or its dict) written by :func:`hf_headattn.evaluation.evaluate_model` for this
            model. Its numbers are the only ones on the card: BLEU, chrF, TER, REP and DROP (those it measured)
            in the results table and the ``model-index``, BLEU by length in a second table.
        dataset_name: Human-readable name of the training/test data, e.g. ``"Multi30k (task 1)"``.
        dataset_id: Its Hub dataset id (``model-index`` ``dataset.type`` and the card's ``datasets``); default:
            `dataset_name`.
        dataset_config: The dataset's configuration name, if any (``model-index`` ``dataset.config``).
        language: ``(source, target)`` language codes.
        repo_id: The Hub repository the card will live in, used in the loading snippets (validated; or an existing
            local folder's path, for snippets that load from disk); default: the folder's name.
            :func:`push_to_hub` warns when the card names another repository.
        model_name: Title and ``model-index`` name; default: `repo_id`'s last part or the folder's name.
        license: A Hub license id (``"apache-2.0"``, ...); the metadata omits it when None.
        training_data: The "Training data" section; default: `dataset_name` plus the pair and epoch counts of the
            folder's ``train_results.json`` (written by the training command), when present.
        limitations: Extra bullet points after the template's own.
        template: Another template file to fill instead of the family's.

    Raises:
        FileNotFoundError: a missing folder, config.json, evaluation JSON or template.
        ValueError: an unknown model_type, an evaluation of another model family or without the required keys,
            bad `language`, or a template placeholder this function does not fill.
    """
    model_dir = Path(model_dir)
    config = _load_config(model_dir)
    evaluation = _load_evaluation(evaluation)
    if evaluation["model"].get("model_type") != config.model_type:
        raise ValueError(f"The evaluation is of a {evaluation['model'].get('model_type')!r} model, but {model_dir} "
                         f"holds a {config.model_type!r} model; evaluate this folder with evaluate_model")
    if isinstance(language, str) or len(language) != 2 or not all(isinstance(code, str) and code for code in language):
        raise ValueError(f"language must be a (source, target) pair of language codes, got {language!r}")
    source_language, target_language = (_LANGUAGE_NAMES.get(code, code) for code in language)
    repo_id = repo_id or model_dir.resolve().name
    if not Path(repo_id).is_dir():  # a local folder's path is what snippets loading from disk name
        try:  # before it is written into the card
            validate_repo_id(repo_id)
        except ValueError as error:
            raise ValueError(f"repo_id {repo_id!r} is not a Hub repository id ({error}); pass repo_id= (--repo_id) "
                             "as user/name") from None
    model_name = model_name or repo_id.split("/")[-1]
    template_path = Path(template) if template is not None else TEMPLATES_DIR / TEMPLATES[config.model_type]
    if not template_path.is_file():
        raise FileNotFoundError(f"Model card template not found: {template_path} (the templates are the "
                                "package's hf_headattn/model_cards/ files; pass template= to use another file)")

    variant_names = _variant_names(config)
    card_data = ModelCardData(
        language=list(language),
        license=license,
        library_name="transformers",
        pipeline_tag="translation",
        tags=_tags(config, variant_names, language),
        datasets=[dataset_id] if dataset_id else None,
        metrics=[metric for metric in _HUB_METRIC_IDS if evaluation.get(metric) is not None],
        model_name=model_name,
        eval_results=_eval_results(evaluation, dataset_name, dataset_id or dataset_name, dataset_config, language),
    )
    values = {
        "metadata": card_data.to_yaml(),
        "model_name": model_name,
        "source_language": source_language,
        "target_language": target_language,
        "architecture": _describe_architecture(config, evaluation),
        "papers": "\n".join(f"- {_PAPERS[key]}" for key in _papers(config, variant_names)),
        "repo_id": repo_id,
        "example_source": _python_string_body(evaluation["examples"][0]["source"]),
        "num_beams": str(evaluation["decoding"]["num_beams"]),
        "training_data": training_data or _describe_training_data(model_dir, dataset_name, dataset_id),
        "results_table": _results_tables(evaluation, dataset_name),
        "evaluation_details": _evaluation_details(evaluation),
        "limitations": "".join(f"- {item}\n" for item in limitations).rstrip("\n"),
    }
    readme = model_dir / "README.md"
    readme.write_text(_fill(template_path, values), encoding="utf-8")
    return readme


def _load_config(model_dir: Path):
    if not (model_dir / "config.json").is_file():
        raise FileNotFoundError(f"{model_dir} is not a saved model folder: it has no config.json")
    model_type = json.loads((model_dir / "config.json").read_text(encoding="utf-8")).get("model_type")
    from .runtime.configuration_headattn import HeadAttnConfig
    from .runtime.configuration_headattn_rnn import HeadAttnRNNConfig

    classes = {"headattn": HeadAttnConfig, "headattn_rnn": HeadAttnRNNConfig}
    if model_type not in classes:
        raise ValueError(f"{model_dir}/config.json has model_type {model_type!r}; model cards exist for: "
                         f"{', '.join(classes)}")
    return classes[model_type].from_pretrained(model_dir)


def _load_evaluation(evaluation: str | Path | Mapping) -> dict:
    if not isinstance(evaluation, Mapping):
        path = Path(evaluation)
        if not path.is_file():
            raise FileNotFoundError(f"Evaluation JSON not found: {path}")
        evaluation = json.loads(path.read_text(encoding="utf-8"))
    missing = [key for key in _REQUIRED_EVALUATION_KEYS if key not in evaluation]
    if missing:
        raise ValueError(f"The evaluation lacks {', '.join(missing)}; write it with "
                         "hf_headattn.evaluation.evaluate_model (examples/evaluate_translation.py)")
    if not evaluation["examples"]:
        raise ValueError("The evaluation has no example sentences (its 'examples' list is empty)")
    return dict(evaluation)


def _fill(template_path: Path, values: Mapping[str, str]) -> str:
    """Replace every ``{name}`` placeholder (lower-case letters and underscores, so code such as
    ``{'translation_text': ...}`` is left alone); a placeholder without a value is an error, not a silent gap."""
    text = template_path.read_text(encoding="utf-8")
    unknown = sorted(set(re.findall(r"\{([a-z_]+)\}", text)) - set(values))
    if unknown:
        raise ValueError(f"{template_path} has placeholder(s) {', '.join('{' + n + '}' for n in unknown)} that "
                         f"write_model_card does not fill; it fills: {', '.join(sorted(values))}")
    return re.sub(r"\{([a-z_]+)\}", lambda match: values[match.group(1)], text)


def _python_string_body(text: str) -> str:
    """`text` as it may stand between double quotes in the card's Python snippet."""
    return text.replace("\\", "\\\\").replace('"', '\\"')


def _variant_names(config) -> list[str]:
    """The attention variants the model uses (Transformer: at any site and layer; LSTM: its transform)."""
    if config.model_type == "headattn_rnn":
        return [config.attention_transform]
    names = {config.attention_variant(site, layer)[0] for site in _SITE_NAMES
             for layer in range(config.encoder_layers if site == "encoder_self_attention" else config.decoder_layers)}
    return sorted(names)


def _tags(config, variant_names: list[str], language: Sequence[str]) -> list[str]:
    tags = ["translation", "hf_headattn", config.model_type, f"{language[0]}-{language[1]}", "custom_code"]
    tags += [name for name in variant_names if name != "softmax"]
    if config.model_type == "headattn_rnn":
        tags.append("lstm")
        if config.num_heads > 1:
            tags.append("multi-head-attention")
        if config.num_hops > 1:
            tags.append("multi-hop-attention")
        if config.coverage_vector:
            tags.append("coverage-vector")
    return tags


def _papers(config, variant_names: list[str]) -> list[str]:
    if config.model_type == "headattn":
        keys = ["transformer"] + [_VARIANT_PAPERS[name] for name in variant_names if name in _VARIANT_PAPERS]
    else:
        keys = ["luong"]
        if config.num_heads > 1 or config.num_hops > 1:
            keys.append("multihop")
        if config.attention_transform != "softmax" or config.coverage_vector:
            keys.append("sparse")
        if config.coverage_vector:
            keys.append("coverage_vector")
    return list(dict.fromkeys(keys))  # once each, in order


def _layer_ranges(layers: list[int]) -> str:
    spans, start = [], layers[0]
    for previous, current in zip(layers, layers[1:] + [None]):
        if current != previous + 1:
            spans.append(str(start) if start == previous else f"{start}-{previous}")
            start = current
    return ("layer " if len(layers) == 1 else "layers ") + ", ".join(spans)


def _describe_site(config, site: str) -> str:
    """e.g. "`softmax` in layers 0-4, `dhicm` (kl_weight=0.1) in layer 5", from the resolved per-layer specs."""
    num_layers = config.encoder_layers if site == "encoder_self_attention" else config.decoder_layers
    placements: dict[str, list[int]] = {}
    for layer in range(num_layers):
        name, options = config.attention_variant(site, layer)
        label = f"`{name}`" + (f" ({', '.join(f'{k}={v}' for k, v in sorted(options.items()))})" if options else "")
        placements.setdefault(label, []).append(layer)
    if len(placements) == 1:
        return f"{next(iter(placements))} in every layer"
    return ", ".join(f"{label} in {_layer_ranges(layers)}" for label, layers in placements.items())


def _describe_fertility(config) -> str:
    return _FERTILITY[config.fertility].format(constant_fertility=config.constant_fertility)


def _describe_architecture(config, evaluation: Mapping) -> str:
    parameters = f"{evaluation['model']['parameters']:,} parameters"
    if config.model_type == "headattn":
        encoder_heads, decoder_heads = config.encoder_attention_heads, config.decoder_attention_heads
        heads = (f"{encoder_heads} heads" if encoder_heads == decoder_heads
                 else f"{encoder_heads} encoder / {decoder_heads} decoder heads")
        lines = [
            f"Transformer: {config.encoder_layers} encoder and {config.decoder_layers} decoder layers, d_model "
            f"{config.d_model}, {heads}, feed-forward {config.encoder_ffn_dim}, {config.position_embedding} position "
            f"embeddings, vocabulary {config.vocab_size:,}; {parameters}.",
            *(f"{title}: {_describe_site(config, site)}." for site, title in _SITE_NAMES.items()),
        ]
        if config.uses_fertility():
            lines.append(f"Fertility of the constrained cross-attention: {_describe_fertility(config)}.")
        if config.pruned_heads:
            pruned = "; ".join(f"{name}: heads {', '.join(map(str, removed))}"
                               for name, removed in config.pruned_heads.items())
            lines.append(f"Pruned heads (indices among each module's original heads): {pruned}.")
    else:
        lines = [
            f"LSTM encoder-decoder: {_count(config.encoder_layers, 'bidirectional encoder layer')} "
            f"({config.hidden_size // 2} units per direction) and {_count(config.decoder_layers, 'decoder layer')} "
            f"with input feeding, embeddings {config.embedding_size}, hidden size {config.hidden_size}, vocabulary "
            f"{config.vocab_size:,}; {parameters}.",
            f"Source attention: {_count(config.num_heads, 'head')} x {_count(config.num_hops, 'hop')}"
            + (f" ({config.hop_mode} hops)" if config.num_hops > 1 else "")
            + f", `{config.attention_score}` scores, `{config.attention_transform}` weights.",
        ]
        if config.uses_fertility():
            lines.append(f"Fertility: {_describe_fertility(config)}; <SINK> token: "
                         f"{config.sink}; exhaustion c = {config.exhaustion:g}.")
        lines.append(f"Coverage vector (Tu et al., 2016): {'yes' if config.coverage_vector else 'no'}.")
    return "\n".join(f"- {line}" for line in lines)


def _count(number: int, noun: str) -> str:
    return f"{number} {noun}{'s' * (number != 1)}"


def _describe_training_data(model_dir: Path, dataset_name: str, dataset_id: str | None) -> str:
    text = dataset_name
    if dataset_id:
        text += f" ([{dataset_id}](https://huggingface.co/datasets/{dataset_id}))"
    results_path = model_dir / "train_results.json"
    if results_path.is_file():  # written by the training command; its counts are measured, not claimed
        results = json.loads(results_path.read_text(encoding="utf-8"))
        facts = []
        if results.get("train_pairs") is not None:
            facts.append(f"{results['train_pairs']:,} sentence pairs")
        if results.get("epoch") is not None:
            facts.append(f"{results['epoch']:.3g} epochs")
        if facts:
            text += ": " + ", ".join(facts)
    return text + "."


def _format_score(value) -> str:
    return "not measured" if value is None else f"{value:.2f}"


def _results_tables(evaluation: Mapping, dataset_name: str) -> str:
    test = evaluation["test_set"]
    names = list(CARD_METRICS.values())
    header = "| test set | sentences | " + " | ".join(names) + " |\n|---|---|" + "---|" * len(names)
    row = (f"| {dataset_name}, {test['name']} | {test['sentences']:,} | "
           + " | ".join(_format_score(evaluation.get(key)) for key in CARD_METRICS) + " |")
    lengths = ["| source length (words) | sentences | BLEU |", "|---|---|---|"]
    for bucket, scores in evaluation["bleu_by_length"].items():
        bleu = "—" if scores["bleu"] is None else f"{scores['bleu']:.2f}"
        lengths.append(f"| {bucket} | {scores['count']:,} | {bleu} |")
    return (f"{header}\n{row}\n\nHigher is better for BLEU and chrF, lower for TER, REP and DROP.\n\n"
            f"BLEU by source length:\n\n" + "\n".join(lengths))


def _evaluation_details(evaluation: Mapping) -> str:
    decoding, settings = evaluation["decoding"], evaluation.get("metric_settings", {})
    lines = [f"Decoding: beam size {decoding['num_beams']}, batches of {decoding['batch_size']}, at most "
             f"{decoding['max_length']} tokens, on {decoding['device']}."]
    signatures = [f"{CARD_METRICS[key]} `{settings[key]}`" for key in _HUB_METRIC_IDS if settings.get(key)]
    if signatures:
        lines.append("sacrebleu signatures: " + ", ".join(signatures) + ".")
    if settings.get("rep_drop_tokenize"):
        lines.append(f"REP and DROP (Malaviya et al., 2018, Sec. 5) count words split with the "
                     f"`{settings['rep_drop_tokenize']}` tokenizer.")
    if evaluation.get("drop") is not None and settings.get("drop_aligner_training_pairs") is not None:
        lines.append(f"DROP aligns with eflomal trained on {settings['drop_aligner_training_pairs']:,} training "
                     "pairs plus the test pairs.")
    examples = ["| source | this model | reference |", "|---|---|---|"] + [
        f"| {_table_cell(example['source'])} | {_table_cell(example['hypothesis'])} | "
        f"{_table_cell(example['reference'])} |"
        for example in evaluation["examples"]
    ]
    return "\n".join(f"- {line}" for line in lines) + "\n\nThe first test sentences:\n\n" + "\n".join(examples)


def _table_cell(text: str) -> str:
    return text.replace("|", "\\|") or " "


def _eval_results(evaluation: Mapping, dataset_name: str, dataset_type: str, dataset_config: str | None,
                  language: Sequence[str]) -> list[EvalResult]:
    settings = evaluation.get("metric_settings", {})
    results = []
    for key, display_name in CARD_METRICS.items():
        if evaluation.get(key) is None:  # DROP without an aligner corpus: not measured, so not claimed
            continue
        config = settings.get(key) if key in _HUB_METRIC_IDS else settings.get("rep_drop_tokenize")
        results.append(EvalResult(
            task_type="translation",
            task_name=f"Translation {language[0]}-{language[1]}",
            dataset_type=dataset_type,
            dataset_name=dataset_name,
            dataset_config=dataset_config,
            dataset_split=evaluation["test_set"]["name"],
            metric_type=key,
            metric_name=display_name,
            metric_value=float(evaluation[key]),
            metric_config=config,
        ))
    return results


# ------------------------------------------------------------------------------------------------ upload
def _folder_files(model_dir: Path) -> list[str]:
    """Every file of the folder (relative paths, sorted) but what ``upload_folder`` never sends (``.git``, caches)
    and symbolic links out of the folder (:func:`links_out_of`)."""
    if not model_dir.is_dir():
        raise FileNotFoundError(f"Model folder not found: {model_dir}")
    outside = links_out_of(model_dir)
    relative = [path.relative_to(model_dir).as_posix() for path in sorted(model_dir.glob("**/*")) if path.is_file()]
    return [name for name in filter_repo_objects(relative, ignore_patterns=list(DEFAULT_IGNORE_PATTERNS))
            if name not in outside]


def links_out_of(model_dir: str | Path) -> dict[str, str]:
    """The folder's files (relative paths) that lead out of it through a symbolic link, with where they lead: never
    uploaded, since they would send a file from elsewhere on this machine."""
    model_dir = Path(model_dir).resolve()
    return {path.relative_to(model_dir).as_posix(): str(path.resolve())
            for path in sorted(model_dir.glob("**/*")) if path.is_file() and not path.resolve().is_relative_to(model_dir)}


# What an access token or a private key looks like; a file to upload that holds one is warned about.
SECRET_PATTERNS = {
    "a Hugging Face token": r"\bhf_[A-Za-z0-9]{30,}",
    "an AWS access key": r"\bAKIA[0-9A-Z]{16}\b",
    "a GitHub token": r"\bgh[pousr]_[A-Za-z0-9]{36,}",
    "an API key (sk-...)": r"\bsk-[A-Za-z0-9_-]{32,}",
    "a Slack token": r"\bxox[abpors]-[A-Za-z0-9-]{10,}",
    "a private key": r"-----BEGIN [A-Z ]*PRIVATE KEY-----",
}


def secrets_in(model_dir: str | Path, names: Sequence[str]) -> list[str]:
    """For each of the folder's files `names` (weights are skipped) that holds what looks like a secret, a line
    naming the file, the line and the kind of secret."""
    found = []
    for name in names:
        if name.endswith(".safetensors"):
            continue
        text = (Path(model_dir) / name).read_text(encoding="utf-8", errors="replace")
        for kind, pattern in SECRET_PATTERNS.items():
            if match := re.search(pattern, text):
                found.append(f"{name}, line {text.count(chr(10), 0, match.start()) + 1}: {kind}")
    return found


def files_to_upload(model_dir: str | Path) -> list[str]:
    """The files (paths relative to `model_dir`, sorted) that :func:`push_to_hub` uploads: those of
    :data:`UPLOADED_FILES` the folder has, the safetensors shards its index names, and the code files its config
    names with every module they import (:func:`needed_code_files`)."""
    model_dir = Path(model_dir)
    files = _folder_files(model_dir)
    wanted = set(UPLOADED_FILES)
    if "model.safetensors.index.json" in files:
        index = json.loads((model_dir / "model.safetensors.index.json").read_text(encoding="utf-8"))
        wanted |= set(index.get("weight_map", {}).values())
    if "config.json" in files:
        wanted |= set(needed_code_files(model_dir, json.loads((model_dir / "config.json").read_text(encoding="utf-8"))))
    return [name for name in files if name in wanted]


def files_left_out(model_dir: str | Path) -> list[str]:
    """The folder's files that :func:`push_to_hub` does not upload (relative paths, sorted)."""
    uploaded = set(files_to_upload(model_dir))
    return [name for name in _folder_files(Path(model_dir)) if name not in uploaded]


def needed_code_files(model_dir: Path, config: dict) -> list[str]:
    """The code files (sorted) that the modules named in `config`'s ``auto_map`` and ``custom_pipelines`` need,
    directly or through their relative imports, as far as the folder's files show (a missing file's own imports
    are unknown)."""
    from transformers.dynamic_module_utils import get_relative_imports

    entries = [reference.split(".")[0] for reference in (config.get("auto_map") or {}).values()]
    entries += [spec["impl"].split(".")[0] for spec in (config.get("custom_pipelines") or {}).values() if "impl" in spec]
    needed, to_visit = set(), [f"{entry}.py" for entry in entries]
    while to_visit:
        name = to_visit.pop()
        if name in needed:
            continue
        needed.add(name)
        if (model_dir / name).is_file():
            to_visit += [f"{module}.py" for module in get_relative_imports(model_dir / name)]
    return sorted(needed)


def missing_code_files(model_dir: Path, config: dict) -> list[str]:
    """The code files of :func:`needed_code_files` that `model_dir` lacks."""
    return [name for name in needed_code_files(model_dir, config) if not (model_dir / name).is_file()]


def check_model_folder(model_dir: str | Path) -> list[str]:
    """Check that `model_dir` holds everything a Hub user needs, and return :func:`files_to_upload`.

    Needed: config.json with ``auto_map`` (AutoConfig, AutoModelForSeq2SeqLM) and the ``translation`` custom
    pipeline, safetensors weights (with every shard an index names; pickle weights such as ``pytorch_model.bin``
    are refused), the code those entries name
    and every module it imports (:func:`missing_code_files`), a tokenizer (tokenizer_config.json and its
    vocabulary, e.g. tokenizer.json) and README.md with card metadata (:func:`write_model_card`).

    Raises:
        FileNotFoundError: if `model_dir` does not exist.
        ValueError: naming everything missing or wrong, all at once.
    """
    model_dir = Path(model_dir)
    files = set(files_to_upload(model_dir))
    problems = [f"{name} as a file of the folder (it is a symbolic link to {target}, outside it; copy the file in)"
                for name, target in links_out_of(model_dir).items()
                if name in UPLOADED_FILES or name.endswith((".py", ".safetensors"))]

    if "config.json" not in files:
        problems.append("config.json")
    else:
        config = json.loads((model_dir / "config.json").read_text(encoding="utf-8"))
        auto_map = config.get("auto_map") or {}
        for auto_class in ("AutoConfig", "AutoModelForSeq2SeqLM"):
            if auto_class not in auto_map:
                problems.append(f"config.json auto_map entry {auto_class} (re-save the model with save_pretrained)")
        if "translation" not in (config.get("custom_pipelines") or {}):
            problems.append("config.json custom_pipelines entry 'translation' (re-save the model with save_pretrained)")
        missing_code = missing_code_files(model_dir, config)
        if missing_code:  # e.g. a folder whose code was copied by hand
            problems.append(f"runtime code file(s) {', '.join(missing_code)} (re-save the model with save_pretrained, "
                            "which copies the code it runs)")

    weights = [name for name in WEIGHT_FILES if name in files]
    if not weights:
        pickled = [name for name in PICKLE_WEIGHT_FILES if (model_dir / name).is_file()]
        problems.append("weights as model.safetensors" + (
            f" (the folder has only pickle weights, {', '.join(pickled)}, which can run arbitrary code when loaded "
            "and are never uploaded; load the model and save_pretrained it again, which writes safetensors)"
            if pickled else ""))
    for index in (name for name in weights if name.endswith(".index.json")):
        shards = set(json.loads((model_dir / index).read_text(encoding="utf-8")).get("weight_map", {}).values())
        problems += [f"weight shard {shard} (named in {index})" for shard in sorted(shards - files)]


    if "tokenizer_config.json" not in files:
        problems.append("tokenizer_config.json (save the tokenizer into the folder)")
    if not any(name in files for name in TOKENIZER_VOCAB_FILES):
        problems.append(f"tokenizer vocabulary ({' or '.join(TOKENIZER_VOCAB_FILES)})")
    elif (model_dir / "run_manifest.json").is_file():
        from .loading import check_tokenizer
        from .tokenization import load_tokenizer

        try:
            check_tokenizer(model_dir, load_tokenizer(model_dir), model_dir)
        except ValueError as error:
            problems.append(f"the tokenizer the model was trained with ({error})")

    if "README.md" not in files:
        problems.append("README.md (write the model card with hf_headattn.hub.write_model_card)")
    else:
        try:
            metadata = ModelCard.load(model_dir / "README.md").data.to_dict()
        except Exception as error:  # the Hub would reject the card too; say why
            problems.append(f"README.md with valid metadata ({error})")
        else:
            if not metadata:
                problems.append("README.md metadata (the card has no YAML front matter; write it with "
                                "write_model_card)")

    if problems:
        raise ValueError(f"{model_dir} is not ready to upload; missing: " + "; ".join(problems))
    return sorted(files)


def push_to_hub(
    model_dir: str | Path,
    repo_id: str,
    *,
    token: str | None = None,
    private: bool = False,
    commit_message: str = "Upload hf_headattn model, tokenizer, code, translation pipeline and model card",
):
    """Upload a saved model folder (model, tokenizer, runtime code, pipeline and card) to the Hub in one commit.

    Runs :func:`check_model_folder` first, so nothing is created on the Hub for an incomplete folder; then
    ``HfApi.create_repo(repo_id, exist_ok=True)`` and ``HfApi.upload_folder`` of :func:`files_to_upload` alone.
    Warns naming the folder's other files (:func:`files_left_out`), and when the card's loading snippets name
    another repository than `repo_id`.

    Returns:
        What ``upload_folder`` returns (a ``CommitInfo``).
    """
    validate_repo_id(repo_id)
    model_dir = Path(model_dir)
    uploaded = check_model_folder(model_dir)
    left_out = [name for name in files_left_out(model_dir)
                if not any(fnmatch.fnmatch(name.split("/")[0], pattern) for pattern in TRAINER_BYPRODUCTS)]
    if left_out:
        warnings.warn(f"Not uploading {len(left_out)} file(s) of {model_dir} that a user of the model does not need: "
                      f"{', '.join(left_out)}", stacklevel=2)
    if outside := links_out_of(model_dir):
        warnings.warn(f"Not uploading symbolic links out of {model_dir}: "
                      f"{', '.join(f'{name} -> {target}' for name, target in outside.items())}", stacklevel=2)
    if secrets := secrets_in(model_dir, uploaded):
        warnings.warn(f"Files to upload look like they hold secrets: {'; '.join(secrets)}. Remove them from the "
                      "files before pushing (an uploaded secret must be revoked)", stacklevel=2)
    if f'"{repo_id}"' not in (model_dir / "README.md").read_text(encoding="utf-8"):
        warnings.warn(f"The model card's loading snippets do not name {repo_id!r}; rewrite it with "
                      f"write_model_card(..., repo_id={repo_id!r}) so that they work for users", stacklevel=2)
    api = HfApi(token=token)
    repo_url = api.create_repo(repo_id, private=private, exist_ok=True, repo_type="model")
    return api.upload_folder(
        repo_id=getattr(repo_url, "repo_id", repo_id),  # the full id when a bare name was given
        folder_path=str(model_dir),
        repo_type="model",
        commit_message=commit_message,
        allow_patterns=uploaded,  # file names, each matching only itself
    )


# ------------------------------------------------------------------------------------------------ Spaces
# A Space holds the web demo (hf_headattn.app) with the modules it runs, copied unchanged into a package of the
# Space, so that it runs with torch, Transformers and gradio alone; its models load through their own code.
SPACE_PACKAGE = "headattn_app"
SPACE_ENTRY = "app.py"  # the demo's module; the Space holds it and every module it imports (space_code_files)
# The commands' model loading, imported only by the commands' main functions: a Space loads its models through their
# own code (app.load_through_own_code), and loading.py would reach into the package's runtime.
SPACE_LEFT_OUT = ("loading.py",)
SPACE_MODELS = "models"
SPACE_FILES = ("app.py", "requirements.txt", "README.md")
SPACE_REQUIREMENTS = ("torch", "transformers")  # with this package's own version ranges (its metadata)

SPACE_APP = '''"""A Gradio Space written by `hf-headattn-hub space`: translate with {names} and compare where the models'
attention goes (heat maps per layer and head, word alignments, weights over heads, fertility bounds).

It runs with torch, Transformers and gradio alone: each model loads through the code saved with it
(trust_remote_code=True), and {package}/ holds the page's code, copied from hf_headattn {version}.
Locally: pip install -r requirements.txt "gradio=={gradio_version}" && python app.py
"""

import os
import sys
from pathlib import Path

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))  # {package}/ beside this file, wherever it is started from

from {package}.app import build_demo, launch, load_models  # noqa: E402  (after the two settings above)

# (label in the page, where it loads from: a folder of this Space or a Hub model id, whether it is a folder here)
MODELS = {models}
# what a visitor may ask for (see {package}/app.py)
SETTINGS = {settings}

models = load_models([str(HERE / source) if bundled else source for _, source, bundled in MODELS],
                     labels=[label for label, _, _ in MODELS])
demo = build_demo(models, **SETTINGS)

if __name__ == "__main__":
    launch(demo)  # GRADIO_SERVER_NAME / GRADIO_SERVER_PORT (a Space sets them), else 127.0.0.1:7860
'''


def _code_closure(folder: Path, entry: str) -> tuple[list[str], list[str]]:
    """(the modules of `folder` that `entry` needs, those missing): `entry` and every module it imports relatively,
    directly or through others, at module or function level, but :data:`SPACE_LEFT_OUT`.

    Raises:
        ValueError: a module that imports from a subpackage (the runtime) or hf_headattn by name, which a Space
            does not have.
    """
    import ast

    needed, missing, to_visit = [], [], [entry]
    while to_visit:
        name = to_visit.pop()
        if name in needed or name in missing or name in SPACE_LEFT_OUT:
            continue
        if not (folder / name).is_file():
            missing.append(name)
            continue
        needed.append(name)
        for node in ast.walk(ast.parse((folder / name).read_text(encoding="utf-8"))):
            absolute = ([alias.name for alias in node.names] if isinstance(node, ast.Import) else
                        [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else [])
            if any(module.split(".")[0] == "hf_headattn" for module in absolute):
                raise ValueError(f"{name} imports hf_headattn by name, which a Space does not have")
            if not isinstance(node, ast.ImportFrom) or not node.level:
                continue
            if node.level > 1 or (node.module and "." in node.module):
                raise ValueError(f"{name} imports from a subpackage ({'.' * node.level}{node.module}), which a Space "
                                 "does not have: the demo's modules may import only the package's top-level modules")
            to_visit += [f"{node.module}.py"] if node.module else [f"{alias.name}.py" for alias in node.names]
    return sorted(needed), sorted(missing)


def space_code_files() -> list[str]:
    """The package's modules a Space runs (copied unchanged into its ``headattn_app/``): the demo
    (:mod:`hf_headattn.app`) and every module it imports, transitively, but :data:`SPACE_LEFT_OUT`."""
    needed, missing = _code_closure(Path(__file__).parent, SPACE_ENTRY)
    if missing:
        raise ValueError(f"The demo imports modules the package lacks: {', '.join(missing)}")
    return needed


def _space_model_problems(model_dir: Path) -> list[str]:
    """What a model folder lacks to run in a Space without this package: config with an ``auto_map`` entry for
    AutoModelForSeq2SeqLM and the code it needs, safetensors weights, a tokenizer (a card is optional: its
    examples become the page's)."""
    files = set(files_to_upload(model_dir))
    problems = []
    if "config.json" not in files:
        problems.append("config.json")
    else:
        config = json.loads((model_dir / "config.json").read_text(encoding="utf-8"))
        if "AutoModelForSeq2SeqLM" not in (config.get("auto_map") or {}):
            problems.append("config.json auto_map entry AutoModelForSeq2SeqLM (re-save the model with save_pretrained)")
        missing = missing_code_files(model_dir, config)
        if missing:
            problems.append(f"runtime code file(s) {', '.join(missing)} (re-save the model with save_pretrained)")
    if not any(name in files for name in WEIGHT_FILES):
        problems.append("weights as model.safetensors")
    if "tokenizer_config.json" not in files or not any(name in files for name in TOKENIZER_VOCAB_FILES):
        problems.append("a tokenizer (tokenizer_config.json and its vocabulary; save the tokenizer into the folder)")
    return problems


def _space_model_name(model_dir: Path, taken: set[str]) -> str:
    """A folder name for a bundled model: the folder's name, with its parent's before it when that name says
    nothing (``runs/demo-csparsemax/model`` -> ``demo-csparsemax-model``), unique among `taken`."""
    parts = model_dir.resolve().parts
    name = "-".join(parts[-2:]) if parts[-1] in ("model", "final", "output") and len(parts) > 1 else parts[-1]
    name = re.sub(r"[^A-Za-z0-9._-]+", "-", name).strip("-.") or "model"
    unique, suffix = name, 2
    while unique in taken:
        unique, suffix = f"{name}-{suffix}", suffix + 1
    return unique


def _space_requirements() -> str:
    """requirements.txt: torch and Transformers with this package's own version ranges (gradio comes from the
    README's sdk_version, as Spaces install it)."""
    from importlib.metadata import requires

    wanted = []
    for requirement in requires("hf_headattn") or []:
        name = re.split(r"[<>=!~;\[ ]", requirement, maxsplit=1)[0].lower()
        if name in SPACE_REQUIREMENTS and "extra ==" not in requirement:
            wanted.append(requirement.replace(" ", ""))
    return "\n".join(sorted(wanted)) + "\n"


def write_space(
    models: Sequence[str | Path],
    output_dir: str | Path,
    *,
    title: str | None = None,
    overwrite: bool = False,
    settings: Mapping | None = None,
) -> Path:
    """Write a Gradio Space folder that runs the web demo (:mod:`hf_headattn.app`) on `models`, and return it.

    The folder holds ``app.py`` (the Space's entry), ``headattn_app/`` (the demo's modules, copied unchanged),
    ``requirements.txt`` (torch, Transformers), ``README.md`` (the Space's front matter: gradio SDK at the installed
    gradio's version, ``app_file``, the Hub models it uses) and ``models/``: each local model folder's files that
    :func:`files_to_upload` names (config, weights, code, tokenizer, card). A Hub model id is loaded from the Hub
    instead. It runs with torch, Transformers and gradio alone (``python app.py``); :func:`push_space` uploads it.

    Args:
        models: Saved model folders, or Hub model ids; one panel each, the first two side by side.
        output_dir: The Space folder to write (written to a temporary folder first and renamed into place).
        title: The Space's title (default: from the models' names).
        overwrite: Replace an existing `output_dir`.
        settings: The page's limits and starting values, passed to :func:`hf_headattn.app.build_demo`
            (``max_lines``, ``time_limit``, ``concurrency_limit``, ``queue_size``, ``num_beams``,
            ``max_new_tokens``); default: the app's defaults.

    Raises:
        ValueError: no model, a folder missing what a Space needs (all problems named), a name that is neither a
            folder nor a Hub id, an `output_dir` that exists (without `overwrite`) or is inside a model folder, or
            gradio not installed (the Space pins its version).
    """
    import shutil
    from importlib.metadata import PackageNotFoundError, version

    from huggingface_hub import SpaceCardData

    from . import app

    if not models:
        raise ValueError("Name at least one model for the Space")
    try:
        gradio_version = version("gradio")
    except PackageNotFoundError:
        raise ValueError('Writing a Space needs gradio installed (pip install "hf_headattn[app]"): the Space pins the '
                         "gradio version its page was made with") from None
    output_dir = Path(output_dir)
    entries, problems, taken = [], [], set()
    for model in models:
        path = Path(model)
        if path.is_dir():
            if output_dir.resolve().is_relative_to(path.resolve()):
                raise ValueError(f"--output_dir {output_dir} is inside the model folder {path}; write the Space "
                                 "elsewhere")
            missing = _space_model_problems(path)
            if missing:
                problems.append(f"{path}: " + "; ".join(missing))
            name = _space_model_name(path, taken)
            taken.add(name)
            entries.append((name, f"{SPACE_MODELS}/{name}", True, path))
        else:
            try:
                validate_repo_id(str(model))
            except ValueError:
                raise ValueError(f"{model} is neither a model folder nor a Hub model id") from None
            entries.append((str(model), str(model), False, None))
    if problems:
        raise ValueError("Cannot write the Space; missing: " + " | ".join(problems))
    if output_dir.exists() and not overwrite:
        raise ValueError(f"{output_dir} exists; choose another --output_dir or pass --overwrite")
    if not output_dir.parent.is_dir():
        raise ValueError(f"Cannot write {output_dir}: its folder {output_dir.parent} does not exist")

    page_settings = dict(max_lines=app.DEFAULT_MAX_LINES, time_limit=app.DEFAULT_TIME_LIMIT,
                         concurrency_limit=app.DEFAULT_CONCURRENCY, queue_size=app.DEFAULT_QUEUE_SIZE,
                         num_beams=app.DEFAULT_NUM_BEAMS, max_new_tokens=app.DEFAULT_MAX_NEW_TOKENS)
    unknown = set(settings or {}) - set(page_settings)
    if unknown:
        raise ValueError(f"Unknown page setting(s) {', '.join(sorted(unknown))}; known: {', '.join(page_settings)}")
    page_settings.update(settings or {})
    names = [label for label, *_ in entries]
    title = title or ("hf_headattn: " + " vs ".join(names[:2]) + (" and more" if len(names) > 2 else ""))
    package_version = version("hf_headattn")

    staging = staging_folder(output_dir)
    try:
        code_dir = staging / SPACE_PACKAGE
        code_dir.mkdir()
        (code_dir / "__init__.py").write_text(f'"""The web demo of hf_headattn {package_version}, copied unchanged by '
                                              '`hf-headattn-hub space`."""\n', encoding="utf-8")
        for module in space_code_files():
            shutil.copyfile(Path(__file__).with_name(module), code_dir / module)
        rows = []
        for label, source, bundled, path in entries:
            if bundled:
                for name in files_to_upload(path):
                    (staging / source / name).parent.mkdir(parents=True, exist_ok=True)
                    shutil.copyfile(path / name, staging / source / name)
                description = app.describe_model(_load_config(path))
            else:
                description = "loaded from the Hub"
            rows.append(f"| {_table_cell(label)} | {_table_cell(description)} | `{source}` |")
        listing = ",\n    ".join(repr((label, source, bundled)) for label, source, bundled, _ in entries)
        (staging / "app.py").write_text(SPACE_APP.format(
            names=", ".join(names), package=SPACE_PACKAGE, version=package_version, gradio_version=gradio_version,
            models=f"[\n    {listing},\n]", settings=repr(page_settings)), encoding="utf-8")
        (staging / "requirements.txt").write_text(_space_requirements(), encoding="utf-8")
        card = SpaceCardData(title=title, sdk="gradio", sdk_version=gradio_version, app_file="app.py",
                             models=[source for _, source, bundled, _ in entries if not bundled] or None,
                             tags=["translation", "hf_headattn", "attention-visualization"], emoji="🔎",
                             colorFrom="blue", colorTo="indigo", pinned=False,
                             short_description="Translate and compare where attention variants look")
        (staging / "README.md").write_text(
            f"---\n{card.to_yaml()}\n---\n\n# {title}\n\nTranslate with {len(entries)} hf_headattn model(s) and "
            "compare, two side by side, where their attention goes: the cross-attention as heat maps of source "
            "words x target words per layer and head, the word alignment as links, DHICM and multi-hop weights "
            "over heads, and csoftmax / csparsemax cumulative attention against the fertility bounds.\n\n"
            "| model | attention | loads from |\n|---|---|---|\n" + "\n".join(rows) + "\n\n"
            "The Space runs with torch, Transformers and gradio alone: each model loads through the code saved "
            f"with it (`trust_remote_code=True`), and `{SPACE_PACKAGE}/` holds the page's code, copied from "
            f"hf_headattn {package_version}. To run it elsewhere:\n\n"
            f"```bash\npip install -r requirements.txt \"gradio=={gradio_version}\"\npython app.py   # then open "
            "http://127.0.0.1:7860\n```\n", encoding="utf-8")
        if output_dir.exists():
            shutil.rmtree(output_dir)
        staging.rename(output_dir)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return output_dir


def check_space_folder(space_dir: str | Path) -> list[str]:
    """Check that `space_dir` is a Space :func:`write_space` wrote, complete, and return the files that
    :func:`push_space` uploads (sorted): its entry, requirements, card, the page's code and each bundled model's
    files (:func:`files_to_upload`); caches a local run leaves (``__pycache__``, ``.gradio``) stay home.

    Raises:
        FileNotFoundError: a missing folder.
        ValueError: naming everything missing, all at once.
    """
    from huggingface_hub import SpaceCard

    space_dir = Path(space_dir)
    if not space_dir.is_dir():
        raise FileNotFoundError(f"Space folder not found: {space_dir}")
    problems = [name for name in SPACE_FILES if not (space_dir / name).is_file()]
    code_dir = space_dir / SPACE_PACKAGE
    present, absent = _code_closure(code_dir, SPACE_ENTRY) if code_dir.is_dir() else ([], [SPACE_ENTRY])
    code = [f"{SPACE_PACKAGE}/{name}" for name in ("__init__.py", *present)]
    problems += [f"{SPACE_PACKAGE}/{name}" for name in ("__init__.py", *absent) if not (code_dir / name).is_file()]
    if (space_dir / "README.md").is_file():
        metadata = SpaceCard.load(space_dir / "README.md").data.to_dict()
        if metadata.get("sdk") != "gradio" or metadata.get("app_file") != "app.py":
            problems.append("README.md front matter with sdk: gradio and app_file: app.py (write the folder with "
                            "hf-headattn-hub space)")
    files = [name for name in SPACE_FILES if (space_dir / name).is_file()] + [name for name in code
                                                                               if (space_dir / name).is_file()]
    models_dir = space_dir / SPACE_MODELS
    for model_dir in sorted(models_dir.iterdir()) if models_dir.is_dir() else []:
        if model_dir.is_dir():
            missing = _space_model_problems(model_dir)
            problems += [f"{SPACE_MODELS}/{model_dir.name}: {'; '.join(missing)}"] if missing else []
            files += [f"{SPACE_MODELS}/{model_dir.name}/{name}" for name in files_to_upload(model_dir)]
    if problems:
        raise ValueError(f"{space_dir} is not a complete Space; missing: " + "; ".join(problems))
    return sorted(files)


def push_space(space_dir: str | Path, repo_id: str, *, token: str | None = None, private: bool = False,
               commit_message: str = "Upload the hf_headattn web demo"):
    """Upload a Space folder written by :func:`write_space` to the Hub as a Gradio Space, in one commit: runs
    :func:`check_space_folder` first (nothing is created for an incomplete folder), then
    ``HfApi.create_repo(repo_type="space", space_sdk="gradio", exist_ok=True)`` and ``upload_folder`` of the checked
    files alone.

    Returns:
        What ``upload_folder`` returns (a ``CommitInfo``).
    """
    validate_repo_id(repo_id)
    space_dir = Path(space_dir)
    uploaded = check_space_folder(space_dir)
    api = HfApi(token=token)
    repo_url = api.create_repo(repo_id, private=private, exist_ok=True, repo_type="space", space_sdk="gradio")
    return api.upload_folder(repo_id=getattr(repo_url, "repo_id", repo_id), folder_path=str(space_dir),
                             repo_type="space", commit_message=commit_message, allow_patterns=uploaded)


# ------------------------------------------------------------------------------------------------ command line
EXAMPLES = """examples:
  # fill the family's card template from hf-headattn-evaluate's JSON into runs/de-en/README.md
  hf-headattn-hub card --model runs/de-en --evaluation runs/de-en/eval/test_2016_flickr.beam4.metrics.json \\
      --dataset_name "Multi30k (task 1)" --dataset_id bentrevett/multi30k --language de en --repo_id user/de-en
  # check the folder is complete, then upload model, tokenizer, code, pipeline and card in one commit
  hf-headattn-hub push --model runs/de-en --repo_id user/de-en --private
  # a Gradio Space with the web demo of two models (runs with torch, Transformers and gradio alone), then upload it
  hf-headattn-hub space --model runs/demo/model --model runs/demo-csparsemax/model --output_dir runs/space
  hf-headattn-hub push --space runs/space --repo_id user/headattn-demo
"""


def make_parser() -> argparse.ArgumentParser:
    parser = UnderscoreArgumentParser(
        prog="hf-headattn-hub", formatter_class=HelpFormatter, epilog=EXAMPLES,
        description="Model cards and Hub upload for saved model folders.\n"
                    "`hf-headattn-hub COMMAND --help` lists a command's flags.")
    add_verbose_argument(parser)
    # subcommands take the underscore spelling (--output_dir) with the dashed one as an alias
    commands = parser.add_subparsers(dest="command", required=True, parser_class=UnderscoreArgumentParser)

    def add_command(name, help):
        return commands.add_parser(name, help=help, description=help, formatter_class=HelpFormatter,
                                   epilog=EXAMPLES)

    card = add_command("card", "write <model>/README.md from an evaluation JSON")
    card.add_argument("--model", required=True, help="saved model folder")
    card.add_argument("--evaluation", required=True, help="metrics JSON written by hf-headattn-evaluate")
    card.add_argument("--dataset_name", required=True, help='e.g. "Multi30k (task 1)"')
    card.add_argument("--dataset_id", default=None, help="Hub dataset id, e.g. bentrevett/multi30k")
    card.add_argument("--dataset_config", default=None, help="Hub dataset configuration, if it has several")
    card.add_argument("--language", nargs=2, default=["de", "en"], metavar=("SOURCE", "TARGET"),
                      help="source and target language codes")
    card.add_argument("--repo_id", default=None, help="the Hub repository the snippets load from")
    card.add_argument("--model_name", default=None,
                      help="the card's title (None: --repo_id's last part, else the folder name)")
    card.add_argument("--license", default=None, help="Hub license id, e.g. apache-2.0 (omitted if not given)")
    card.add_argument("--training_data", default=None, help="text of the Training data section")
    card.add_argument("--limitation", action="append", default=[], help="an extra limitation bullet (repeatable)")
    push = add_command("push", "check the folder and upload it to the Hub")
    what = push.add_mutually_exclusive_group(required=True)
    what.add_argument("--model", help="saved model folder with README.md")
    what.add_argument("--space", help="a Space folder written by `hf-headattn-hub space`, uploaded as a Gradio Space")
    push.add_argument("--repo_id", required=True, help="Hub repository, e.g. user/de-en (created if missing)")
    push.add_argument("--private", action="store_true", help="create the repository private")
    push.add_argument("--commit_message", default=None, help="None: huggingface_hub's default message")
    space = add_command("space", "write a Gradio Space folder with the web demo of one or more models")
    space.add_argument("--model", action="append", required=True,
                       help="saved model folder (copied into the Space) or Hub model id; repeat for side by side")
    space.add_argument("--output_dir", required=True, help="the Space folder to write")
    space.add_argument("--title", default=None, help="the Space's title (None: from the models' names)")
    space.add_argument("--overwrite", action="store_true", help="replace an existing --output_dir")
    return parser


def main(argv=None):
    """The `hf-headattn-hub` command (also `python -m hf_headattn.hub`)."""
    parser = make_parser()
    args = parser.parse_args(argv)
    configure_logging(args.verbose)

    if args.command == "card":
        print("written:", write_model_card(
            args.model, args.evaluation, dataset_name=args.dataset_name, dataset_id=args.dataset_id,
            dataset_config=args.dataset_config, language=tuple(args.language), repo_id=args.repo_id,
            model_name=args.model_name, license=args.license, training_data=args.training_data,
            limitations=args.limitation,
        ))
    elif args.command == "space":
        try:
            print("written:", write_space(args.model, args.output_dir, title=args.title, overwrite=args.overwrite))
        except ValueError as error:
            parser.exit(1, f"{parser.prog} space: error: {error}\n")
    elif args.space:
        message = {"commit_message": args.commit_message} if args.commit_message else {}
        try:
            print("uploaded:", _commit_url(push_space(args.space, args.repo_id, private=args.private, **message)))
        except (FileNotFoundError, ValueError) as error:
            parser.exit(1, f"{parser.prog} push: error: {error}\n")
    else:
        message = {"commit_message": args.commit_message} if args.commit_message else {}
        print("uploaded:", _commit_url(push_to_hub(args.model, args.repo_id, private=args.private, **message)))


def _commit_url(commit_info) -> str:
    """The address of the commit an upload made (what ``upload_folder``'s ``CommitInfo`` names)."""
    return str(getattr(commit_info, "commit_url", None) or commit_info)


if __name__ == "__main__":
    main()
