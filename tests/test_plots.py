"""The figures render for trained tiny models: cross-attention maps (both families), DHICM head importances, BLEU by
length of several systems and learned entmax alphas, through the functions and the `python -m
hf_headattn.commands.plot` command."""

import json
from pathlib import Path

import pytest
from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

from hf_headattn.commands import plot
from hf_headattn.evaluation import evaluate_model
from hf_headattn.plotting import (
    head_importance_figure,
    learned_alphas,
    load_bleu_by_length,
    plot_attention_map,
    plot_bleu_by_length,
    plot_learned_alphas,
)

# single_thread is an autouse fixture: importing it makes it apply to this module too.
from helpers import random_model, random_rnn_model, rnn_config, tiny_config, toy_data, train_tiny_model


SENTENCE = "der kleine hund sieht die katze ."
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return toy_data(tmp_path_factory.mktemp("data"))


@pytest.fixture(scope="module")
def folders(data, tmp_path_factory):
    """A Transformer with DHICM in the last encoder layer (head importances to plot) and a 2-head LSTM."""
    return {
        "transformer": train_tiny_model(data, tmp_path_factory.mktemp("dhicm"), "transformer",
                                        "--encoder-self-attention", "dhicm"),
        "rnn": train_tiny_model(data, tmp_path_factory.mktemp("rnn"), "rnn"),
    }


@pytest.fixture(scope="module")
def loaded(folders):
    """Each folder loaded the way users load it: through its own code."""
    return {family: (AutoModelForSeq2SeqLM.from_pretrained(folder, trust_remote_code=True).eval(),
                     AutoTokenizer.from_pretrained(folder, trust_remote_code=True))
            for family, folder in folders.items()}


@pytest.fixture(scope="module")
def evaluations(folders, data, tmp_path_factory):
    """Two systems' evaluation JSONs on the same test set with the same length buckets."""
    output = tmp_path_factory.mktemp("evaluations")
    systems = {"transformer": ("transformer", 1), "rnn": ("rnn", 2)}
    return {name: evaluate_model(folders[family], data["test.src"], data["test.tgt"], num_beams=beams, batch_size=16,
                                 device="cpu", output_dir=output / name, buckets=(5, 8))["files"]["metrics"]
            for name, (family, beams) in systems.items()}


def assert_png(path):
    assert path.is_file() and path.stat().st_size > 1000 and path.read_bytes()[:8] == PNG_SIGNATURE


def heatmap_panels(figure):
    """The figure's heat-map axes (not its colour bar)."""
    return [axes for axes in figure.axes if axes.images]


def tick_labels(axis):
    return [label.get_text() for label in axis.get_ticklabels()]


# ------------------------------------------------------------------------------------------------ attention maps
def test_attention_map_of_every_head_of_the_transformer(loaded, tmp_path):
    model, tokenizer = loaded["transformer"]
    path = tmp_path / "attention.png"
    figure = plot_attention_map(model, tokenizer, SENTENCE, path, heads="all", return_figure=True)
    assert_png(path)
    panels = heatmap_panels(figure)
    assert [axes.get_title() for axes in panels] == ["head 1", "head 2", "head 3", "head 4"]
    source_tokens = tokenizer.convert_ids_to_tokens(tokenizer(SENTENCE)["input_ids"])
    for axes in panels:
        assert axes.get_xlabel() == "source tokens" and axes.get_ylabel() == "target tokens"
        assert tick_labels(axes.xaxis) == source_tokens
        values = axes.images[0].get_array()
        assert values.shape == (len(tick_labels(axes.yaxis)), len(source_tokens))
        assert abs(values.sum(axis=1) - 1).max() < 1e-5  # each target token's softmax attention sums to 1
    assert figure.get_suptitle() == "cross-attention: decoder.layers.1.encoder_attn"


def test_attention_map_of_a_chosen_layer_and_a_given_target(loaded, tmp_path):
    model, tokenizer = loaded["transformer"]
    target = "the small dog sees the cat ."
    figure = plot_attention_map(model, tokenizer, SENTENCE, tmp_path / "layer0.png", layer=0, target=target,
                                return_figure=True)
    [panel] = heatmap_panels(figure)
    assert panel.get_title() == "mean of 4 heads"
    assert tick_labels(panel.yaxis) == tokenizer.convert_ids_to_tokens(tokenizer(text_target=target)["input_ids"])
    assert figure.get_suptitle() == "cross-attention: decoder.layers.0.encoder_attn"
    with pytest.raises(ValueError, match=r"layer=2 is out of range: this model returns 2 cross-attention layer\(s\), "
                                         r"so layers in \[-2, 1\] are accepted"):
        plot_attention_map(model, tokenizer, SENTENCE, tmp_path / "bad.png", layer=2)
    with pytest.raises(ValueError, match=r"heads='first'; accepted: mean, all"):
        plot_attention_map(model, tokenizer, SENTENCE, tmp_path / "bad.png", heads="first")


@pytest.mark.parametrize("heads", ["mean", "all"])
def test_attention_map_of_the_lstm(loaded, tmp_path, heads):
    model, tokenizer = loaded["rnn"]
    path = tmp_path / f"{heads}.png"
    figure = plot_attention_map(model, tokenizer, SENTENCE, path, heads=heads, num_beams=2, max_new_tokens=5,
                                return_figure=True)
    assert_png(path)
    panels = heatmap_panels(figure)
    assert [axes.get_title() for axes in panels] == (["mean of 2 heads"] if heads == "mean" else ["head 1", "head 2"])
    for axes in panels:
        assert axes.get_xlabel() == "source tokens" and axes.get_ylabel() == "target tokens"
        assert 1 <= len(tick_labels(axes.yaxis)) <= 5  # the translation's tokens, at most max_new_tokens
    assert figure.get_suptitle() == "cross-attention: source attention"


# ------------------------------------------------------------------------------------------------ head importances
def test_head_importances_of_the_dhicm_model(loaded, tmp_path):
    model, tokenizer = loaded["transformer"]
    path = tmp_path / "importances.png"
    figure = head_importance_figure(model, tokenizer, SENTENCE, path, return_figure=True)
    assert_png(path)
    [panel] = heatmap_panels(figure)
    assert (panel.get_xlabel(), panel.get_ylabel()) == ("head", "source token")
    assert panel.get_title() == "encoder.layers.1.self_attn"
    assert tick_labels(panel.xaxis) == ["head 1", "head 2", "head 3", "head 4"]
    assert tick_labels(panel.yaxis) == tokenizer.convert_ids_to_tokens(tokenizer(SENTENCE)["input_ids"])
    assert head_importance_figure(model, tokenizer, SENTENCE, path) == path  # the path by default, as before


# ------------------------------------------------------------------------------------------------ BLEU by length
def test_bleu_by_length_of_several_systems(evaluations, tmp_path):
    systems = {name: next(iter(load_bleu_by_length(path).values())) for name, path in evaluations.items()}
    path = tmp_path / "bleu_by_length.png"
    figure = plot_bleu_by_length(systems, path, title="toy test set", return_figure=True)
    assert_png(path)
    [axes] = figure.axes
    assert (axes.get_xlabel(), axes.get_ylabel()) == ("source length (words)", "BLEU")
    assert [line.get_label() for line in axes.get_lines()] == list(evaluations)
    counts = [systems["rnn"][bucket]["count"] for bucket in ("<5", "5-7", ">=8")]
    assert tick_labels(axes.xaxis) == [f"{bucket}\n(n={n})" for bucket, n in zip(("<5", "5-7", ">=8"), counts)]
    for line, system in zip(axes.get_lines(), systems.values()):
        assert list(line.get_ydata()) == pytest.approx([system[bucket]["bleu"] for bucket in system])

    other_buckets = {"<10": {"count": 12, "bleu": 1.0}, ">=10": {"count": 0, "bleu": None}}
    with pytest.raises(ValueError, match="Systems use different length buckets"):
        plot_bleu_by_length({**systems, "other": other_buckets}, tmp_path / "bad.png")


def test_results_files_name_their_systems(evaluations, tmp_path):
    model_name = json.loads(Path(evaluations["rnn"]).read_text())["model"]["name"]
    assert list(load_bleu_by_length(evaluations["rnn"])) == [model_name]
    # the example scripts' results.json: {"results": {system: {... "bleu_by_length": ...}}}
    combined = tmp_path / "results.json"
    curves = {name: json.loads(Path(path).read_text()) for name, path in evaluations.items()}
    combined.write_text(json.dumps({"settings": {}, "results": curves}))
    assert list(load_bleu_by_length(combined)) == list(evaluations)
    (tmp_path / "nothing.json").write_text(json.dumps({"bleu": 1.0}))
    with pytest.raises(ValueError, match="holds no BLEU by length"):
        load_bleu_by_length(tmp_path / "nothing.json")
    with pytest.raises(FileNotFoundError, match="Results file not found"):
        load_bleu_by_length(tmp_path / "missing.json")


# ------------------------------------------------------------------------------------------------ the command
def test_plotting_command(folders, evaluations, tmp_path, capsys):
    attention = tmp_path / "attention.png"
    plot.main(["attention-map", "--model", str(folders["rnn"]), "--sentence", SENTENCE, "--layer", "-1",
                   "--heads", "all", "--output", str(attention)])
    assert_png(attention)
    lengths = tmp_path / "lengths.png"
    plot.main(["bleu-by-length", "--results", *evaluations.values(), "--labels", "A", "B",
                   "--output", str(lengths)])
    assert_png(lengths)
    importances = tmp_path / "importances.png"
    plot.main(["head-importances", "--model", str(folders["transformer"]), "--sentence", SENTENCE,
                   "--output", str(importances)])
    assert_png(importances)
    assert capsys.readouterr().out.splitlines()[-3:] == [f"written: {path}" for path in (attention, lengths, importances)]
    with pytest.raises(SystemExit) as refused:
        plot.main(["bleu-by-length", "--results", *evaluations.values(), "--labels", "A",
                       "--output", str(lengths)])
    assert refused.value.code == 1 and "error: 1 labels for 2 systems" in capsys.readouterr().err


# ------------------------------------------------------------------------------------------------ learned alphas
def _alpha_model(logits):
    """A Transformer with learned-alpha entmax at every site; each module's alpha logits set from `logits`."""
    import torch

    config = tiny_config(**{site: "entmax_alpha" for site in
                            ("encoder_self_attention", "decoder_self_attention", "cross_attention")})
    model = random_model(config)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if name.endswith("alpha_logit"):
                parameter.copy_(torch.tensor(logits[:parameter.numel()]))
    return model


def test_learned_alphas_are_read_per_site_layer_and_head():
    model = _alpha_model([0.0, 2.0, -2.0, 40.0])
    alphas = learned_alphas(model)
    assert len(alphas) == 6  # 2 encoder + 2 decoder layers' self-attention, 2 cross-attentions
    expected = [1.5, 1.880797, 1.119203, 2.0]  # 1 + sigmoid(logit)
    for module in alphas.values():
        assert module["alphas"] == pytest.approx(expected, abs=1e-6)
    assert {(module["site"], module["layer"]) for module in alphas.values()} == {
        (site, layer) for site in ("encoder_self_attention", "decoder_self_attention", "cross_attention")
        for layer in (0, 1)}
    fixed = random_model(tiny_config(cross_attention={"type": "entmax_alpha", "alpha": 1.3}))
    assert learned_alphas(fixed) == {}  # a fixed alpha is not learned
    lstm = random_rnn_model(rnn_config(attention_transform="entmax_alpha", num_heads=2))
    (source_attention,) = learned_alphas(lstm).values()  # the LSTM's one attention, 2 heads (random weights)
    assert len(source_attention["alphas"]) == 2 and all(1 < alpha <= 2 for alpha in source_attention["alphas"])


def test_learned_alphas_figure_has_a_panel_per_site_and_a_point_per_head(tmp_path):
    runs = {"seed 1": learned_alphas(_alpha_model([0.0, 2.0, -2.0, 40.0])),
            "seed 2": learned_alphas(_alpha_model([1.0, 1.0, 1.0, 1.0]))}
    figure = plot_learned_alphas(runs, tmp_path / "alphas.png", return_figure=True)
    assert_png(tmp_path / "alphas.png")
    assert [axis.get_title() for axis in figure.axes] == ["encoder self attention", "decoder self attention",
                                                          "cross attention"]
    points = [len(collection.get_offsets()) for axis in figure.axes for collection in axis.collections]
    assert points == [8] * 6  # per panel and run: 2 layers x 4 heads
    with pytest.raises(ValueError, match="no learned alphas in softmax"):
        plot_learned_alphas({"softmax": {}}, tmp_path / "none.png")
    assert not (tmp_path / "none.png").exists()


def test_learned_alphas_command_writes_the_figure_and_the_alphas(tmp_path, capsys):
    from hf_headattn import train_tokenizer
    from hf_headattn.toy_corpus import make_toy_corpus

    folder = tmp_path / "alpha"
    _alpha_model([0.0, 2.0, -2.0, 40.0]).save_pretrained(folder)
    train_tokenizer(texts=[text for pair in make_toy_corpus(50, seed=5) for text in pair],
                    vocab_size=64).save_pretrained(folder)
    output = tmp_path / "figure" / "alphas.png"
    output.parent.mkdir()
    plot.main(["learned-alphas", "--models", str(folder), "--labels", "seed 1", "--output", str(output)])
    assert_png(output)
    written = json.loads(output.with_suffix(".json").read_text())
    assert list(written) == ["seed 1"] and len(written["seed 1"]) == 6
    assert capsys.readouterr().out.splitlines() == [
        "seed 1: 24 heads, alpha 1.119-2.000, mean 1.625",
        f"written: {output} and {output.with_suffix('.json')}"]
    with pytest.raises(SystemExit) as refused:
        plot.main(["learned-alphas", "--models", str(folder), "--labels", "a", "b", "--output", str(output)])
    assert refused.value.code == 1 and "error: 2 labels for 1 models" in capsys.readouterr().err
