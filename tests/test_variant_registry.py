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
