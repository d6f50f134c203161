"""A variant is one module and one registry line: registered, it is described by every tool that shows variants (the
model card, the web page's model description, the training command's --help) without any other file naming it."""

import re

import pytest

from helpers import tiny_config
from hf_headattn.app import describe_model
from hf_headattn.commands.train import make_parser
from hf_headattn.publish import write_model_card
from hf_headattn.runtime.attention_registry import ATTENTION_VARIANTS
from hf_headattn.runtime.attention_softmax import SoftmaxAttention


class ToyAttention(SoftmaxAttention):
    name = "toy_attention"
    description = "a toy for the registry test: softmax under another name"
    paper = "Toy & Test (2026), *One Module and One Line*: `toy_attention`, registered by a test."
    sites = ("cross_attention",)


@pytest.fixture
def toy_registered(monkeypatch):
    monkeypatch.setitem(ATTENTION_VARIANTS, ToyAttention.name, ToyAttention)


def _evaluation(config) -> dict:
    """An evaluation JSON of the shape `evaluate_model` writes (hf_headattn.evaluation), with made-up numbers."""
    return {"bleu": 12.5, "chrf": 40.0, "ter": 70.0, "rep": 1.0, "drop": None,
            "bleu_by_length": {"<10": {"count": 2, "bleu": 12.5}},
            "model": {"name": "toy", "model_type": config.model_type, "parameters": 1234},
            "test_set": {"name": "toy_test", "source": "test.de", "reference": "test.en", "sentences": 2},
            "decoding": {"name": "greedy", "num_beams": 1, "coverage_penalty": 0.0, "batch_size": 2,
                         "max_length": 64, "device": "cpu", "translation_seconds": 0.1},
            "metric_settings": {}, "examples": [{"source": "ein hund", "reference": "a dog", "hypothesis": "a dog"}]}


def test_a_registered_variant_is_in_the_card_the_page_and_the_training_help(toy_registered, tmp_path):
    config = tiny_config(cross_attention={"type": "toy_attention", "layers": [-1]})
    config.save_pretrained(tmp_path)
    card = write_model_card(tmp_path, _evaluation(config), language=("de", "en"), repo_id="someone/toy",
                            dataset_name="toy pairs").read_text()
    assert ToyAttention.paper in card and "`toy_attention` in layer 1" in card and "- toy_attention" in card
    assert "cross-attention: softmax / toy_attention (by layer)" in describe_model(config)
    help_text = make_parser().format_help()
    assert re.search(rf"\n  toy_attention +{re.escape(ToyAttention.description)} \[cross\]\n", help_text)


def test_no_tooling_module_names_a_variant_or_tests_a_model_type():
    """Variants and families answer for themselves: outside the runtime, no string constant is a registered
    variant's name (but "softmax", the default every attention flag starts from; the package's __init__ exports the
    kernels `sparsemax`, `csoftmax`, `csparsemax` under their function names) or a model type, and no expression
    compares a `model_type`."""
    import ast
    from pathlib import Path

    from hf_headattn.auto_classes import CONFIG_CLASSES

    package = Path(__file__).resolve().parents[1] / "hf_headattn"
    named = (set(ATTENTION_VARIANTS) - {"softmax"}) | {config_class.model_type for config_class in CONFIG_CLASSES}
    found = []
    for path in sorted(package.rglob("*.py")):
        if "runtime" in path.relative_to(package).parts or path == package / "__init__.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Constant) and node.value in named:
                found.append(f"{path.relative_to(package)}:{node.lineno} {node.value!r}")
            if isinstance(node, ast.Compare) and any(
                    isinstance(side, ast.Attribute) and side.attr == "model_type"
                    and any(isinstance(other, ast.Constant) for other in (node.left, *node.comparators))
                    for side in (node.left, *node.comparators)):
                found.append(f"{path.relative_to(package)}:{node.lineno} compares a model_type")
    assert not found, found
