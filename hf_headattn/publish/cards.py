"""Model cards for saved model folders: the family's template (``hf_headattn/model_cards/``) filled from an evaluation.

:func:`write_model_card` picks the template of the folder's model family (``model_cards/<config.family>.md``:
``transformer.md``, ``lstm.md``), describes the configured attention variants from the config, and fills in the measured numbers of an evaluation JSON
(:func:`hf_headattn.evaluation.evaluate_model`) as a results table and as ``model-index`` metadata, which the Hub
shows as evaluation results and which ``huggingface_hub`` parses back (``ModelCard.load``,
``model_index_to_eval_results``). A repository id is validated before it is written into a card.

What a card says about the variants and the families (papers, tags, the architecture's description) comes from the
config (`family`, `attention_variant_names`, `papers`, `card_tags`, `describe_architecture`) and the variants it
names, so a new variant or family needs nothing here.

Tooling, not model runtime: never copied into a checkpoint.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from huggingface_hub import EvalResult, ModelCardData
from huggingface_hub.utils import validate_repo_id

from ..output_files import write_text

# transformers and the model classes are imported where they are used, so that the command's `--help` is instant.

__all__ = ["CARD_METRICS", "TEMPLATES_DIR", "load_config", "markdown_table_cell", "write_model_card"]

# The card templates are package data (pyproject.toml), so a wheel install has them too.
TEMPLATES_DIR = Path(__file__).resolve().parent.parent / "model_cards"

# Evaluation JSON key -> name shown on the card and in model-index; lower is better for the last three.
CARD_METRICS = {"bleu": "BLEU", "chrf": "chrF", "ter": "TER", "rep": "REP", "drop": "DROP"}
_HUB_METRIC_IDS = ("bleu", "chrf", "ter")  # the ones the Hub knows as metrics (REP and DROP are this project's)

_LANGUAGE_NAMES = {"be": "Belarusian", "cs": "Czech", "de": "German", "en": "English", "es": "Spanish",
                   "fr": "French", "hi": "Hindi", "it": "Italian", "ja": "Japanese", "ro": "Romanian",
                   "ru": "Russian", "zh": "Chinese"}


@dataclass(frozen=True)
class _Dataset:
    """The training and test data as the card names it: its name, Hub dataset id and configuration."""

    name: str
    id: str | None
    config: str | None


def write_model_card(
    model_dir: str | Path, evaluation: str | Path | Mapping, *, dataset_name: str, dataset_id: str | None = None,
    dataset_config: str | None = None, language: Sequence[str] = ("de", "en"), repo_id: str | None = None,
    model_name: str | None = None, license: str | None = None, training_data: str | None = None,
    limitations: Sequence[str] = (), template: str | Path | None = None,
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
    config = load_config(model_dir)
    evaluation = _load_evaluation(evaluation)
    if evaluation["model"].get("model_type") != config.model_type:
        raise ValueError(f"The evaluation is of a {evaluation['model'].get('model_type')!r} model, but {model_dir} "
                         f"holds a {config.model_type!r} model; evaluate this folder with evaluate_model")
    source_language, target_language = _language_names(language)
    repo_id = _checked_repo_id(repo_id or model_dir.resolve().name)
    model_name = model_name or repo_id.split("/")[-1]
    template_path = _template_path(template, config.family)

    dataset = _Dataset(dataset_name, dataset_id, dataset_config)
    values = {
        "metadata": _card_metadata(config, evaluation, dataset, language=language, license=license,
                                   model_name=model_name),
        "model_name": model_name,
        "source_language": source_language,
        "target_language": target_language,
        "architecture": _describe_architecture(config, evaluation),
        "papers": "\n".join(f"- {paper}" for paper in config.papers()),
        "repo_id": repo_id,
        "example_source": _python_string_body(evaluation["examples"][0]["source"]),
        "num_beams": str(evaluation["decoding"]["num_beams"]),
        "training_data": training_data or _describe_training_data(model_dir, dataset_name, dataset_id),
        "results_table": _results_tables(evaluation, dataset_name),
        "evaluation_details": _evaluation_details(evaluation),
        "limitations": "".join(f"- {item}\n" for item in limitations).rstrip("\n"),
    }
    return write_text(model_dir / "README.md", _fill(template_path, values))


def _language_names(language: Sequence[str]) -> tuple[str, str]:
    """The names of the (source, target) languages of the codes `language`, refused (ValueError) unless a pair."""
    if isinstance(language, str) or len(language) != 2 or not all(isinstance(code, str) and code for code in language):
        raise ValueError(f"language must be a (source, target) pair of language codes, got {language!r}")
    source_language, target_language = (_LANGUAGE_NAMES.get(code, code) for code in language)
    return source_language, target_language


def _checked_repo_id(repo_id: str) -> str:
    """`repo_id`, refused (ValueError) before it is written into the card unless it is a Hub repository id or a
    local folder's path (what snippets loading from disk name)."""
    if not Path(repo_id).is_dir():
        try:
            validate_repo_id(repo_id)
        except ValueError as error:
            raise ValueError(f"repo_id {repo_id!r} is not a Hub repository id ({error}); pass repo_id= (--repo_id) "
                             "as user/name") from None
    return repo_id


def _template_path(template: str | Path | None, family: str) -> Path:
    """The card template to fill: `template`, else the family's (``hf_headattn/model_cards/<family>.md``)."""
    template_path = Path(template) if template is not None else TEMPLATES_DIR / f"{family}.md"
    if not template_path.is_file():
        raise FileNotFoundError(f"Model card template not found: {template_path} (the templates are the "
                                "package's hf_headattn/model_cards/ files; pass template= to use another file)")
    return template_path


def _card_metadata(config, evaluation: Mapping, dataset: _Dataset, *, language: Sequence[str], license: str | None,
                   model_name: str) -> str:
    """The card's YAML front matter: what the Hub indexes (language, license, tags, datasets, metrics) and the
    ``model-index`` of the evaluation's scores."""
    card_data = ModelCardData(
        language=list(language),
        license=license,
        library_name="transformers",
        pipeline_tag="translation",
        tags=_tags(config, config.attention_variant_names(), language),
        datasets=[dataset.id] if dataset.id else None,
        metrics=[metric for metric in _HUB_METRIC_IDS if evaluation.get(metric) is not None],
        model_name=model_name,
        eval_results=_eval_results(evaluation, dataset.name, dataset.id or dataset.name, dataset.config, language),
    )
    return card_data.to_yaml()


def load_config(model_dir: Path):
    """The folder's config, as one of this package's config classes (which answer what a card asks)."""
    if not (model_dir / "config.json").is_file():
        raise FileNotFoundError(f"{model_dir} is not a saved model folder: it has no config.json")
    model_type = json.loads((model_dir / "config.json").read_text(encoding="utf-8")).get("model_type")
    from ..auto_classes import CONFIG_CLASSES

    classes = {config_class.model_type: config_class for config_class in CONFIG_CLASSES}
    if model_type not in classes:
        raise ValueError(f"{model_dir}/config.json has model_type {model_type!r}; model cards exist for: "
                         f"{', '.join(classes)}")
    return classes[model_type].from_pretrained(model_dir)


def _load_evaluation(evaluation: str | Path | Mapping) -> dict:
    """The evaluation a card is filled from, checked before anything is written: JSON (`read_metrics_json`: file,
    line and column of a syntax error), every number finite, and every field the card reads there and of its type
    (`_CARD_FIELDS`, the buckets of BLEU by length, the examples)."""
    from ..evaluation import non_finite_field, read_metrics_json

    if not isinstance(evaluation, Mapping):
        evaluation = read_metrics_json(evaluation, what="Evaluation JSON")
        if not isinstance(evaluation, Mapping):
            raise ValueError(f"The evaluation JSON holds a {type(evaluation).__name__}, not the object "
                             "hf_headattn.evaluation.evaluate_model writes")
    elif (field := non_finite_field(dict(evaluation))) is not None:
        raise ValueError(f"The evaluation's {field[0]} is {field[1]}, not a finite number; a score that was not "
                         "measured is None")
    missing = [name for name in _CARD_FIELDS if _field(evaluation, name) is _MISSING]
    if missing:
        raise ValueError(f"The evaluation lacks {', '.join(missing)}; write it with "
                         "hf_headattn.evaluation.evaluate_model (examples/evaluate_translation.py)")
    for name, (accepted, kinds) in _CARD_FIELDS.items():
        _check_kind(name, _field(evaluation, name), accepted, kinds)
    for name in ("rep", "drop"):
        _check_kind(name, evaluation.get(name), "a number or null", (int, float, type(None)))
    for bucket, scores in evaluation["bleu_by_length"].items():
        _check_kind(f"bleu_by_length.{bucket}", scores, "an object of count and bleu", (Mapping,))
        _check_kind(f"bleu_by_length.{bucket}.count", scores.get("count"), "a whole number", (int,))
        _check_kind(f"bleu_by_length.{bucket}.bleu", scores.get("bleu"), "a number or null", (int, float, type(None)))
    if not evaluation["examples"]:
        raise ValueError("The evaluation has no example sentences (its 'examples' list is empty)")
    for index, example in enumerate(evaluation["examples"]):
        _check_kind(f"examples.{index}", example, "an object of source, hypothesis and reference", (Mapping,))
        for key in ("source", "hypothesis", "reference"):
            _check_kind(f"examples.{index}.{key}", example.get(key), "text", (str,))
    return dict(evaluation)


# What a card reads of an evaluation (dotted: nested fields), as (what is accepted, its Python types); REP and DROP,
# which it reads too, may be missing or null (not measured)
_CARD_FIELDS = {
    **{key: ("a number", (int, float)) for key in ("bleu", "chrf", "ter")},
    "bleu_by_length": ("an object of buckets", (Mapping,)),
    "model.model_type": ("text", (str,)),
    "model.parameters": ("a whole number", (int,)),
    "test_set.name": ("text", (str,)),
    "test_set.sentences": ("a whole number", (int,)),
    "decoding.num_beams": ("a whole number", (int,)),
    "decoding.batch_size": ("a whole number", (int,)),
    "decoding.max_length": ("a whole number", (int,)),
    "decoding.device": ("text", (str,)),
    "examples": ("a list", (list,)),
}
_MISSING = object()


def _field(evaluation: Mapping, name: str):
    value = evaluation
    for key in name.split("."):
        if not isinstance(value, Mapping) or key not in value:
            return _MISSING
        value = value[key]
    return value


def _check_kind(name: str, value, accepted: str, kinds: tuple) -> None:
    if isinstance(value, bool) or not isinstance(value, kinds):
        raise ValueError(f"The evaluation's {name} is {value!r}; a card needs {accepted} there (as "
                         "hf_headattn.evaluation.evaluate_model writes it)")


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


def _tags(config, variant_names: list[str], language: Sequence[str]) -> list[str]:
    tags = ["translation", "hf_headattn", config.model_type, f"{language[0]}-{language[1]}", "custom_code"]
    tags += [name for name in variant_names if name != "softmax"]
    return tags + config.card_tags()


def _describe_architecture(config, evaluation: Mapping) -> str:
    first, *rest = config.describe_architecture()
    lines = [f"{first}; {evaluation['model']['parameters']:,} parameters.", *rest]
    return "\n".join(f"- {line}" for line in lines)


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
        f"| {markdown_table_cell(example['source'])} | {markdown_table_cell(example['hypothesis'])} | "
        f"{markdown_table_cell(example['reference'])} |"
        for example in evaluation["examples"]
    ]
    return "\n".join(f"- {line}" for line in lines) + "\n\nThe first test sentences:\n\n" + "\n".join(examples)


def markdown_table_cell(text: str) -> str:
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
