"""The web page's logic (hf_headattn.app) without a browser: what each panel shows for every variant of both families
(the heat map's cells, the links, the weights over heads, the fertility bounds), the messages for empty, over-long and
cut input, a model that fails to load, a failing or slow translation, and the page served over HTTP."""

import re
import time

import pytest
import torch

from hf_headattn import train_tokenizer
from hf_headattn.app import page, panels
from hf_headattn.app.page import PANEL_OUTPUTS, translate_page
from hf_headattn.app.panels import (EMPTY_INPUT, DemoInputError, DemoModel, card_examples, describe_model, load_models,
                                    run_with_time_limit, split_lines, translate_panel)
from hf_headattn.app.views import ALIGNMENT_VIEW, MEAN_VIEW, render_heatmap, render_panel, word_grid
from hf_headattn.commands import app as app_command
from hf_headattn.toy_corpus import make_toy_corpus
from hf_headattn.translation import HypothesisAttention, translate

from helpers import (RNN_CONFIGS, RNN_EOS_BIAS, VARIANT_CONFIGS, VOCAB, free_port, random_model, random_rnn_model,
                     rnn_config, tiny_config)

SETTINGS = dict(num_beams=2, nbest=2, max_new_tokens=8)


@pytest.fixture(scope="module")
def pairs():
    return make_toy_corpus(300, seed=3)


@pytest.fixture(scope="module")
def tokenizer(pairs):
    return train_tokenizer(texts=[text for pair in pairs for text in pair], vocab_size=VOCAB)


@pytest.fixture(scope="module")
def lines(pairs):
    return split_lines(f"{pairs[0][0]}\n\n{pairs[1][0]}")[0]


MODELS = {**{f"transformer {name}": ("transformer", name) for name in VARIANT_CONFIGS},
          **{f"lstm {name}": ("lstm", name) for name in RNN_CONFIGS}}


def build_model(family, name):
    if family == "transformer":
        return random_model(tiny_config(**VARIANT_CONFIGS[name]))
    return random_rnn_model(rnn_config(**RNN_CONFIGS[name]), eos_bias=RNN_EOS_BIAS.get(name, 0.0))


def cells(html):
    return html.count('class="hm-cell"')


def table_shape(html):
    rows, columns = re.search(r'data-rows="(\d+)" data-columns="(\d+)"', html).groups()
    return int(rows), int(columns)


# ------------------------------------------------------------------------------------------------ every variant
@pytest.mark.parametrize("name", sorted(MODELS))
def test_every_view_of_every_variant_draws_what_translate_kept(name, tokenizer, lines):
    model = build_model(*MODELS[name])
    result = translate_panel(DemoModel(name, model, tokenizer), lines, **SETTINGS)
    assert result.error is None and [line.number for line in result.lines] == [1, 3]
    expected = translate(model, tokenizer, [text for _, text in lines], nbest=2, num_beams=2, max_new_tokens=8,
                         alignments=True)
    assert [[h.text for h in line.translation.hypotheses] for line in result.lines] == \
        [[h.text for h in translation.hypotheses] for translation in expected]
    constrained = {"csoftmax", "csparsemax"}
    config = model.config
    if config.model_type == "headattn":
        has_constrained = any(config.attention_variant("cross_attention", layer)[0] in constrained
                              for layer in range(config.decoder_layers))
    else:
        has_constrained = config.attention_transform in constrained

    for k, line in enumerate(result.lines):
        for rank, hypothesis in enumerate(line.translation.hypotheses):
            show = f"{k}:{rank}"
            views = [(str(result.alignment_layer), ALIGNMENT_VIEW)] + [
                (str(layer), heads) for layer, kept in enumerate(result.layer_heads)
                for heads in (MEAN_VIEW, *map(str, kept))]
            for layer, heads in views:
                drawn = render_panel(result, show, layer, heads)
                rows, columns = table_shape(drawn["heatmap"])
                assert cells(drawn["heatmap"]) == rows * columns > 0
                # every word cell and target row as the translation and the source split them, plus </s>
                target_words, source_words = len(hypothesis.text.split()), len(line.translation.source.split())
                ends = hypothesis.attention.target_tokens[-1] == tokenizer.eos_token
                assert rows == target_words + ends
                assert columns - source_words in (1, 2)  # </s>, and the sink's column where rows sum below 1
            # the links: one line per Pharaoh pair
            assert drawn["links"].count("<line ") == len(hypothesis.alignment.split())
            # weights over heads: one block per module that has them, one bar per head
            importances = hypothesis.attention.head_importances
            assert drawn["importances"].count('class="importances"') == len(importances)
            for module, values in importances.items():
                block = drawn["importances"].split(f'data-module="{module}"')[1].split('class="importances"')[0]
                means = [float(value) for value in re.findall(r'title="head \d+: ([\d.]+)"', block)]
                assert means == pytest.approx(values.mean(0).tolist(), abs=1e-3)
            # constrained attention: each head's total stays within each token's fertility bound
            bars = re.findall(r'title="head \d+: ([\d.]+) of ([\d.]+)"', drawn["fertility"])
            assert bool(bars) == has_constrained
            assert all(float(value) <= float(bound) + 2e-3 for value, bound in bars)
            assert "fert-over" not in drawn["fertility"]
            if has_constrained:
                assert len(bars) == sum(len(result.layer_heads[layer]) for layer in result.constrained_layers) * \
                    len(hypothesis.attention.source_tokens)


def test_word_grid_sums_source_tokens_and_averages_target_tokens():
    attention = HypothesisAttention(
        source_tokens=["▁der", "▁", "hu", "nd", "</s>"], target_tokens=["▁the", "▁do", "g", "</s>"],
        source_words=[0, -1, 1, 1, -1], target_words=[0, 1, 1, -1], cross_attentions=(), alignment_attention=None)
    weights = torch.tensor([[0.7, 0.0, 0.1, 0.1, 0.1],
                            [0.1, 0.2, 0.3, 0.2, 0.2],
                            [0.0, 0.0, 0.5, 0.1, 0.1],   # sums to 0.7: 0.3 went to the sink
                            [0.0, 0.0, 0.0, 0.0, 1.0]])
    grid = word_grid(weights, attention, "der hund", "the dog", ["</s>", "<pad>"])
    assert grid.rows == ["the", "dog", "</s>"] and grid.columns == ["der", "hund", "</s>", "sink"]
    assert grid.column_tokens[1] == ["▁", "hu", "nd"]  # a whitespace token joins the word that follows it
    expected = [[0.7, 0.2, 0.1, 0.0],
                [0.05, 0.65, 0.15, 0.15],  # the mean of "▁do" and "g": 0.1 | 0.7 | 0.2 and 0.0 | 0.6 | 0.1 (+ 0.3)
                [0.0, 0.0, 1.0, 0.0]]
    assert grid.values == [pytest.approx(row, abs=1e-6) for row in expected]
    html = render_heatmap(grid, "test")
    assert cells(html) == 12 and table_shape(html) == (3, 4)
    assert 'title="dog → hund: 0.650"' in html


# ------------------------------------------------------------------------------------------------ messages
def test_input_lines_empty_and_too_many():
    for text in ("", "  \n\t\n", None):
        with pytest.raises(DemoInputError, match="Nothing to translate"):
            split_lines(text)
    lines, notices = split_lines("a\n\nb\nc\n \nd\ne", max_lines=3)
    assert lines == [(1, "a"), (3, "b"), (4, "c")]
    assert notices == ["Only the first 3 lines are translated here; left out: lines 6, 7."]


def test_an_over_long_source_says_which_words_were_left_out(tokenizer, pairs):
    model = random_model(tiny_config(vocab_size=len(tokenizer), max_position_embeddings=10))
    long_line = " ".join(source for source, _ in pairs[:3])
    result = translate_panel(DemoModel("short", model, tokenizer), [(2, long_line)], num_beams=1, max_new_tokens=4)
    attention = result.lines[0].translation.hypotheses[0].attention
    assert len(attention.source_tokens) == 10  # the model read 10 tokens
    read = max(attention.source_words) + 1
    words = long_line.split()
    length = len(tokenizer(long_line)["input_ids"])
    assert (f"Line 2 is {length} tokens long, and this model reads at most 10: it translated the first {read} of "
            f"its {len(words)} words and left out “{' '.join(words[read:])}”.") in result.notices
    rows, columns = table_shape(render_panel(result)["heatmap"])
    assert columns - read in (1, 2)  # the heat map shows the words read


def test_cut_translations_and_the_time_limit_are_named(tokenizer, lines, monkeypatch):
    model = random_model(tiny_config(vocab_size=len(tokenizer)))
    result = translate_panel(DemoModel("m", model, tokenizer), lines, num_beams=1, max_new_tokens=3)
    cut = [line.number for line in result.lines
           if result.lines and line.translation.hypotheses[0].attention.target_tokens[-1] != tokenizer.eos_token]
    assert cut, "a random model rarely ends within 3 tokens"
    assert f"Cut translations ({', '.join(f'line {n}' for n in cut)}): no end of sentence, as they reached max new " \
           "tokens (3); raise it to let them finish." in result.notices

    # decoding stops at the time limit (generate's max_time), and the page says so
    seen = {}
    original = panels.translate

    def recording(*args, **kwargs):
        seen.update(kwargs)
        return original(*args, **kwargs)

    monkeypatch.setattr(panels, "translate", recording)
    started = time.perf_counter()
    result = translate_panel(DemoModel("m", model, tokenizer), lines, num_beams=1, max_new_tokens=200,
                             time_limit=1e-4)
    assert seen["max_time"] == 1e-4 and time.perf_counter() - started < 30
    assert any("decoding reached the time limit of 0.0001 s" in notice for notice in result.notices)

    with pytest.raises(TimeoutError, match="No answer within 0.2 s: try fewer or shorter lines"):
        run_with_time_limit(lambda: time.sleep(3), 0.2)


def test_settings_out_of_range_are_refused_with_a_message(tokenizer, lines):
    model = DemoModel("m", random_model(tiny_config(vocab_size=len(tokenizer))), tokenizer)
    with pytest.raises(DemoInputError, match=r"n-best \(3\) is more than the beams \(2\)"):
        translate_panel(model, lines, num_beams=2, nbest=3)
    with pytest.raises(DemoInputError, match="Beams must be between 1 and 8; got 0"):
        translate_panel(model, lines, num_beams=0)
    with pytest.raises(DemoInputError, match="Max new tokens must be between 1 and 256; got 1000"):
        translate_panel(model, lines, max_new_tokens=1000)


def test_a_model_that_fails_to_load_is_a_message_and_the_others_work(tokenizer, tmp_path):
    good = random_model(tiny_config(vocab_size=len(tokenizer)))

    def load(name):
        if name == "broken":
            raise OSError("broken does not appear to have a file named config.json")
        return good, tokenizer

    models = load_models(["broken", "good", "good"], load)
    assert [model.name for model in models] == ["broken", "good", "good (2)"]
    assert models[0].error == "OSError: broken does not appear to have a file named config.json"
    assert models[0].description.startswith("not loaded: OSError")
    assert models[1].model is good and models[1].error is None
    result = translate_panel(models[0], [(1, "der hund .")])
    assert result.error == ("Model broken could not be loaded: OSError: broken does not appear to have a file named "
                            "config.json") and not result.lines
    assert render_panel(result) == {"heatmap": "", "links": "", "importances": "", "fertility": ""}


def test_the_page_never_shows_a_stack_trace(tokenizer, monkeypatch):
    pytest.importorskip("gradio")
    model = DemoModel("m", random_model(tiny_config(vocab_size=len(tokenizer))), tokenizer)
    broken = DemoModel("broken", error="OSError: no config.json")
    models = {"m": model, "broken": broken}
    outputs = translate_page(models, "   ", ["m", "broken"], 2, 1, 8)
    assert EMPTY_INPUT in outputs[0] and len(outputs) == 1 + 2 * len(PANEL_OUTPUTS)

    outputs = translate_page(models, "der hund .", ["m", "broken"], 2, 3, 8)
    panel, other = outputs[1:1 + len(PANEL_OUTPUTS)], outputs[1 + len(PANEL_OUTPUTS):]
    assert "n-best (3) is more than the beams (2)" in panel[1] and 'class="error"' in panel[1]
    assert "Model broken could not be loaded: OSError: no config.json" in other[1]

    def failing(*args, **kwargs):
        raise RuntimeError("boom\n  at somewhere")

    monkeypatch.setattr(panels, "translate", failing)
    outputs = translate_page(models, "der hund .", ["m", "m"], 2, 1, 8)
    assert "Translating failed: RuntimeError: boom at somewhere" in outputs[2]
    assert not any("Traceback" in str(output) for output in outputs)


def test_card_examples_come_from_the_cards_test_sentences(tmp_path):
    (tmp_path / "README.md").write_text(
        "---\nlanguage: [de, en]\n---\n# card\n\nThe first test sentences:\n\n"
        "| source | this model | reference |\n|---|---|---|\n"
        "| ein hund läuft . | a dog runs . | a dog runs . |\n"
        "| a \\| b | x | y |\n"
        "|   | empty | source |\n"
        "| ein hund läuft . | again | again |\n\n| other | table |\n", encoding="utf-8")
    assert card_examples(tmp_path) == ["ein hund läuft .", "a | b"]
    assert card_examples(tmp_path / "missing") == []
    assert card_examples("someone/not-downloaded") == []  # offline (conftest): a Hub card that cannot be read
    (tmp_path / "README.md").write_text("# a card without examples\n", encoding="utf-8")
    assert card_examples(tmp_path) == []


def test_descriptions_name_the_variants_of_both_families():
    config = tiny_config(cross_attention=[{"type": "softmax", "layers": [0]}, {"type": "csparsemax", "layers": [1]}])
    assert describe_model(config) == ("Transformer, 2 decoder layers; encoder self-attention: softmax; decoder "
                                      "self-attention: softmax; cross-attention: softmax / csparsemax (by layer); "
                                      "fertility constant")
    assert describe_model(rnn_config(num_heads=2, num_hops=2)) == \
        "LSTM encoder-decoder; source attention: softmax, 2 head(s) x 2 hops (dependent)"


# ------------------------------------------------------------------------------------------------ served



def test_the_page_translates_over_http(tokenizer, lines, capfd):
    pytest.importorskip("gradio")
    from gradio_client import Client

    softmax = random_model(tiny_config(vocab_size=len(tokenizer)))
    csparsemax = random_model(tiny_config(vocab_size=len(tokenizer), cross_attention="csparsemax"))
    models = load_models(["softmax", "csparsemax"], {"softmax": (softmax, tokenizer),
                                                     "csparsemax": (csparsemax, tokenizer)}.__getitem__)
    demo = page.build_demo(models, time_limit=30)
    port = free_port()
    page.launch(demo, host="127.0.0.1", port=port, prevent_thread_lock=True)
    printed = capfd.readouterr()
    assert printed.out == f"page: http://127.0.0.1:{port}/ (Ctrl+C stops it)\n"  # not Gradio's share=True advice
    try:
        client = Client(f"http://127.0.0.1:{port}/", verbose=False)
        text = "\n".join(source for _, source in lines)
        outputs = client.predict(text, 2, 1, 8, "softmax", "csparsemax", api_name="/translate")
    finally:
        demo.close()
    assert "max_length" not in capfd.readouterr().err  # Transformers' max_new_tokens warning, once per request
    panels = [outputs[1:11], outputs[11:21]]
    for panel, model in zip(panels, (softmax, csparsemax)):
        expected = translate(model, tokenizer, [source for _, source in lines], num_beams=2, max_new_tokens=8)
        for translation in expected:
            assert f'<span class="translation-text">{translation.text}</span>' in panel[2]
        assert cells(panel[6]) == (lambda shape: shape[0] * shape[1])(table_shape(panel[6]))
    assert "no fertility" in panels[0][9] and "fertility bound" in panels[1][9]


def test_the_command_loads_its_models_and_serves_the_page(tokenizer, tmp_path, monkeypatch, capsys):
    pytest.importorskip("gradio")
    folder = tmp_path / "model"
    random_model(tiny_config(vocab_size=len(tokenizer), cross_attention="csoftmax")).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    served = {}
    monkeypatch.setattr(page, "launch", lambda demo, **kwargs: served.update(demo=demo, **kwargs))
    built = {}
    original = page.build_demo
    monkeypatch.setattr(page, "build_demo", lambda models, **kwargs: built.update(models=models, **kwargs)
                        or original(models, **kwargs))
    app_command.main(["--model", str(folder), "--model", "someone/not-here", "--port", "7999", "--max-lines", "3",
              "--time_limit", "20"])
    assert (served["host"], served["port"]) == ("127.0.0.1", 7999)
    first, second = built["models"]
    assert first.error is None and "cross-attention: csoftmax" in first.description
    assert second.error.startswith("ValueError: 'someone/not-here' is not a local folder")  # a Hub id needs the flag
    assert (built["max_lines"], built["time_limit"]) == (3, 20.0)
    for flags, message in ((["--num_beams", "0"], "--num_beams must be between 1 and 8, got 0"),
                           (["--max_lines", "0"], "--max_lines must be a positive number, got 0"),
                           (["--time_limit", "-1"], "--time_limit must be positive, got -1.0")):
        with pytest.raises(SystemExit):
            app_command.main(["--model", str(folder), *flags])
        assert message in capsys.readouterr().err
