"""The web page's logic (hf_headattn.app) without a browser: what each panel shows for every variant of both families
(the heat map's cells, every head's small map and statistics, the links, the weights over heads, the fertility
bounds), the data behind the comparing views (sparsity and entropy of a known matrix, exact zeros, the linked layer
and heads choices, the difference view and its refusal, words split for people, the card's examples), the messages
for empty, over-long and cut input, a model that fails to load, a failing or slow translation, and the page served
over HTTP."""

import math
import re
import time

import pytest
import torch

from hf_headattn import train_tokenizer
from hf_headattn.app import page, panels
from hf_headattn.app.page import PAGE_OUTPUTS, PANEL_OUTPUTS, translate_page, update_views
from hf_headattn.app.panels import (EMPTY_INPUT, FALLBACK_EXAMPLE, DemoInputError, DemoModel, PanelResult,
                                    card_examples, describe_model, forced_attention, load_models, page_examples,
                                    run_with_time_limit, same_tokenizer, split_lines, translate_panel)
from hf_headattn.app.views import (ALIGNMENT_VIEW, MEAN_VIEW, VIEWS, HeadStatistics, WordGrid, attention_statistics,
                                   default_layer, linked_head_choices, linked_layer_choices, render_heatmap,
                                   render_panel, render_statistics, split_word, word_grid)
from hf_headattn.commands import app as app_command
from hf_headattn.translation import translator as translator_module
from hf_headattn.toy_corpus import make_toy_corpus
from hf_headattn.translation import HypothesisAttention, translate

from helpers import (RNN_CONFIGS, RNN_EOS_BIAS, VARIANT_CONFIGS, VOCAB, free_port, random_model, random_rnn_model,
                     rnn_config, tiny_config)

SETTINGS = dict(num_beams=2, nbest=2, max_new_tokens=8)

NEEDS_GRADIO = "the web page needs gradio (the app extra): pip install -e \".[app]\""


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
    return html.count('class="hm-cell')  # exact zeros too ("hm-cell hm-zero")


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
                # every head the layer keeps: a small map of the same words and a row of statistics
                kept = result.layer_heads[int(layer)]
                assert re.findall(r'class="small-map[^"]*" data-head="(\d+)"', drawn["grid"]) == list(map(str, kept))
                small_shapes = set(re.findall(r'class="hm hm-small" data-rows="(\d+)" data-columns="(\d+)"',
                                              drawn["grid"]))
                assert len(small_shapes) == 1  # all heads on the same words (and the rest, where one has some)
                small_rows, small_columns = map(int, small_shapes.pop())
                assert small_rows == rows and small_columns - columns in (-1, 0, 1)
                assert cells(drawn["grid"]) == len(kept) * small_rows * small_columns
                assert re.findall(r'<tr class="[^"]*" data-head="(\d+)">', drawn["statistics"]) == list(map(str, kept))
                # a row per target word and a column per source word, words and punctuation apart where the tokens
                # split there ("r." is "r" and "." or, as one token, one word), plus </s> and the sink's column
                ends = hypothesis.attention.target_tokens[-1] == tokenizer.eos_token
                target_words = hypothesis.text.split()
                # (a random model's <unk>: a row with no word of the text)
                unknown = sum(token == tokenizer.unk_token for token in hypothesis.attention.target_tokens)
                assert len(target_words) <= rows - ends <= sum(len(split_word(word)) for word in target_words) + unknown
                source_words = line.translation.source.split()  # the toy corpus: punctuation is a word already
                assert columns - len(source_words) in (1, 2)  # </s>, and the sink's column where rows sum below 1
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


# ------------------------------------------------------------------------------------------------ comparing
def test_sparsity_and_entropy_of_a_known_attention_matrix():
    weights = torch.tensor([[0.5, 0.5, 0.0, 0.0],       # two tokens alike: 1 bit, two exact zeros
                            [1.0, 0.0, 0.0, 0.0],       # one token: 0 bits, three zeros
                            [0.25, 0.25, 0.25, 0.25],   # uniform over four: 2 bits, no zero
                            [0.5, 0.0, 0.0, 0.0]])      # half to one token, half to the sink: 1 bit, three zeros
    sparsity, entropy = attention_statistics(weights)
    assert sparsity == pytest.approx(8 / 16) and entropy == pytest.approx((1 + 0 + 2 + 1) / 4)
    assert attention_statistics(torch.full((3, 5), 1e-12).softmax(-1)) == pytest.approx((0.0, math.log2(5)))
    table = render_statistics([HeadStatistics(1, sparsity, entropy), HeadStatistics(2, 0.0, 2.0)], "layer 1",
                              uniform_entropy=2.0, chosen_head=2)
    assert re.findall(r'data-head="(\d)"><th>head \d</th><td class="sparsity">(\d+)%</td><td class="entropy">([\d.]+)'
                      r"</td>", table) == [("1", "50", "1.00"), ("2", "0", "2.00")]
    assert '<tr class="chosen" data-head="2">' in table and "evenly over the source: 2.00 bits" in table


def test_exact_zeros_look_unlike_small_values_and_the_map_has_a_colour_bar():
    grid = WordGrid(["a"], ["w", "x", "y", "z"], [[0.0, 0.003, 0.01, 0.987]], [["▁a"]],
                    [["▁w"], ["▁x"], ["▁y"], ["▁z"]])
    html = render_heatmap(grid, "test")
    cells_html = re.findall(r"<td [^>]*>[^<]*</td>", html)
    assert 'class="hm-cell hm-zero"' in cells_html[0] and "exactly 0" in cells_html[0]
    assert [re.sub(r"<[^>]+>", "", cell) for cell in cells_html] == ["", "", ".01", ".99"]
    assert "hm-zero" not in "".join(cells_html[1:])  # 0.003 is coloured (faintly), not hatched
    assert "background-color: rgba(29, 78, 216, 0.003)" in cells_html[1]
    assert 'class="colour-bar"' in html and "exactly 0" in html.split('class="colour-bar"')[1]


def test_linked_choices_apply_to_both_panels_and_a_missing_layer_or_head_is_named(tokenizer, lines):
    pytest.importorskip("gradio", reason=NEEDS_GRADIO)  # the page's outputs are gradio updates
    two_layers = PanelResult("a", layer_labels=["layer 1", "layer 2"], layer_heads=[[1, 2, 3, 4], [1, 2, 3, 4]])
    one_layer = PanelResult("b", layer_labels=["source attention"], layer_heads=[[1, 2]])
    assert linked_layer_choices([two_layers, one_layer]) == [("layer 1 / source attention", "0"), ("layer 2", "1")]
    assert linked_head_choices([two_layers, one_layer]) == [
        ("what the alignment reads (heads averaged)", ALIGNMENT_VIEW), ("mean of the layer's heads", MEAN_VIEW),
        ("head 1", "1"), ("head 2", "2"), ("head 3", "3"), ("head 4", "4")]
    assert default_layer([two_layers, one_layer]) == "0" and default_layer([two_layers, PanelResult("c")]) == "1"
    assert linked_layer_choices([PanelResult("c")]) == [] and default_layer([]) is None

    deep = random_model(tiny_config(vocab_size=len(tokenizer), decoder_layers=3, decoder_attention_heads=2))
    shallow = random_model(tiny_config(vocab_size=len(tokenizer)))
    models = {"deep": DemoModel("deep", deep, tokenizer), "shallow": DemoModel("shallow", shallow, tokenizer)}
    outputs = translate_page(models, lines[0][1], ["deep", "shallow"], 1, 1, 6)
    layer = dict(zip(PAGE_OUTPUTS, outputs))["layer"]
    assert layer["value"] == "1" and [value for _, value in layer["choices"]] == ["0", "1", "2"]  # 1: both have it
    deep_result, shallow_result = (output for output in outputs if isinstance(output, PanelResult))
    states = (deep_result, "0:0", shallow_result, "0:0")
    views = update_views("2", "1", None, *states)  # layer 3: only the deep model has it
    deep_views, shallow_views = dict(zip(VIEWS, views[:len(VIEWS)])), dict(zip(VIEWS, views[len(VIEWS):-1]))
    assert "layer 3 (softmax), head 1" in deep_views["heatmap"] and cells(deep_views["grid"]) > 0
    missing_layer = ('<p class="note">This model has no layer 3 of cross-attention; its 2: layer 1 (softmax), '
                     "layer 2 (softmax).</p>")
    assert shallow_views["heatmap"] == shallow_views["grid"] == missing_layer
    views = update_views("1", "4", None, *states)  # head 4: only the shallow model has it
    assert "This model has no head 4 in layer 2 (softmax): its heads there are 1, 2." in views[0]
    assert "layer 2 (softmax), head 4" in views[len(VIEWS)]


def test_the_difference_view_subtracts_two_models_on_one_translation(tokenizer, lines, pairs):
    pytest.importorskip("gradio", reason=NEEDS_GRADIO)  # the page's outputs are gradio updates
    softmax = DemoModel("softmax", random_model(tiny_config(vocab_size=len(tokenizer))), tokenizer)
    sparse = DemoModel("csparsemax", random_model(tiny_config(vocab_size=len(tokenizer), cross_attention="csparsemax"),
                                                  seed=1), tokenizer)
    models = {model.name: model for model in (softmax, sparse)}
    outputs = translate_page(models, lines[0][1], ["softmax", "csparsemax"], 2, 2, 8)
    page_views = dict(zip(PAGE_OUTPUTS, outputs))
    comparison = page_views["comparison"]
    first, second = (output for output in outputs if isinstance(output, PanelResult))
    assert comparison.refusal is None and sorted(comparison.forced) == ["0:0", "0:1"]
    # the second model read the first's translation: a model forced on its own translation attends as it did
    hypothesis = first.lines[0].translation.hypotheses[1]
    forced = comparison.forced["0:1"]
    assert forced.target_tokens == hypothesis.attention.target_tokens
    assert forced.source_tokens == hypothesis.attention.source_tokens
    own = forced_attention(softmax.model, tokenizer, lines[0][1], hypothesis.attention.target_tokens)
    for mine, kept in zip(own.cross_attentions, hypothesis.attention.cross_attentions):
        torch.testing.assert_close(mine, kept, atol=1e-5, rtol=1e-4)
    # its cells: the first map minus the second, on a diverging map; head by head as the page chooses
    difference = update_views("1", "2", comparison, first, "0:1", second, "0:0")[-1]
    assert 'class="hm hm-difference"' in difference and "B more" in difference and "A more" in difference
    head = first.layer_heads[1].index(2)
    expected = word_grid(hypothesis.attention.cross_attentions[1][head] - forced.cross_attentions[1][head],
                         hypothesis.attention, lines[0][1], hypothesis.text, first.special_tokens, None)
    values = [float(value) for value in re.findall(r'title="[^"]*: ([+-][\d.]+)"', difference)]
    assert values[:len(expected.columns)] == pytest.approx(expected.values[0], abs=1e-3)

    # another tokenizer: refused, with why
    other_tokenizer = train_tokenizer(texts=[text for pair in pairs[:100] for text in pair], vocab_size=VOCAB - 10)
    assert same_tokenizer(tokenizer, tokenizer) and not same_tokenizer(tokenizer, other_tokenizer)
    other = DemoModel("other", random_model(tiny_config(vocab_size=len(other_tokenizer))), other_tokenizer)
    outputs = translate_page({**models, "other": other}, lines[0][1], ["softmax", "other"], 1, 1, 6)
    refusal = dict(zip(PAGE_OUTPUTS, outputs))["difference"]
    assert refusal == ('<div class="notice">No difference view: softmax and other have different tokenizers, so their '
                       "attention maps have different tokens for rows and columns. It compares two models that share "
                       "a tokenizer.</div>")


def test_words_are_split_for_people():
    assert split_word("Straße.") == ["Straße", "."]
    assert split_word("„Hallo“,") == ["„", "Hallo", "“,"]
    assert split_word("don't") == ["don't"] and split_word("e-mail") == ["e-mail"] and split_word("...") == ["..."]
    attention = HypothesisAttention(
        source_tokens=["▁die", "▁Straß", "e", ".", "▁nein.", "</s>"], source_words=[0, 1, 1, 1, 2, -1],
        target_tokens=["▁the", "▁street", ".", "</s>"], target_words=[0, 1, 1, -1], cross_attentions=(),
        alignment_attention=None)
    weights = torch.full((4, 6), 1 / 6)
    grid = word_grid(weights, attention, "die Straße. nein.", "the street.", ["</s>"])
    # "Straße." is two words; "nein." stays one, as its one token spans the word and the full stop
    assert grid.columns == ["die", "Straße", ".", "nein.", "</s>"] and grid.rows == ["the", "street", ".", "</s>"]
    assert grid.column_tokens[1:3] == [["▁Straß", "e"], ["."]]
    assert grid.values[0] == pytest.approx([1 / 6, 2 / 6, 1 / 6, 1 / 6, 1 / 6])
    # tokens that do not spell the word (another normalisation): the word stays whole
    attention.source_tokens[1] = "▁strass"
    assert word_grid(weights, attention, "die Straße. nein.", "the street.", ["</s>"]).columns[1] == "Straße."


def test_the_text_box_offers_the_cards_examples(tokenizer):
    pytest.importorskip("gradio", reason=NEEDS_GRADIO)
    model = random_model(tiny_config(vocab_size=len(tokenizer)))
    carded = DemoModel("carded", model, tokenizer, examples=["ein hund läuft .", "a | b"])
    also = DemoModel("also", model, tokenizer, examples=["a | b", "zwei katzen ."])
    bare = DemoModel("bare", model, tokenizer)
    assert page_examples([bare, carded, also]) == ["ein hund läuft .", "a | b", "zwei katzen ."]
    assert page_examples([carded, also], limit=2) == ["ein hund läuft .", "a | b"]

    def text_box(models):
        demo = page.build_demo(models)
        return next(block for block in demo.blocks.values() if getattr(block, "elem_id", None) == "source-text")

    assert text_box([bare, carded]).placeholder == "ein hund läuft ."
    assert text_box([bare]).placeholder == FALLBACK_EXAMPLE


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
    original = translator_module.translate

    def recording(*args, **kwargs):
        seen.update(kwargs)
        return original(*args, **kwargs)

    monkeypatch.setattr(translator_module, "translate", recording)
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
    assert render_panel(result) == dict.fromkeys(VIEWS, "")


def test_the_page_never_shows_a_stack_trace(tokenizer, monkeypatch):
    pytest.importorskip("gradio", reason=NEEDS_GRADIO)
    model = DemoModel("m", random_model(tiny_config(vocab_size=len(tokenizer))), tokenizer)
    broken = DemoModel("broken", error="OSError: no config.json")
    models = {"m": model, "broken": broken}
    outputs = translate_page(models, "   ", ["m", "broken"], 2, 1, 8)
    assert EMPTY_INPUT in outputs[0] and len(outputs) == len(PAGE_OUTPUTS) + 2 * len(PANEL_OUTPUTS)

    outputs = translate_page(models, "der hund .", ["m", "broken"], 2, 3, 8)
    first = len(PAGE_OUTPUTS)
    panel, other = outputs[first:first + len(PANEL_OUTPUTS)], outputs[first + len(PANEL_OUTPUTS):]
    assert "n-best (3) is more than the beams (2)" in panel[1] and 'class="error"' in panel[1]
    assert "Model broken could not be loaded: OSError: no config.json" in other[1]

    def failing(*args, **kwargs):
        raise RuntimeError("boom\n  at somewhere")

    monkeypatch.setattr(translator_module, "translate", failing)
    outputs = translate_page(models, "der hund .", ["m", "m"], 2, 1, 8)
    assert "Translating failed: RuntimeError: boom at somewhere" in outputs[len(PAGE_OUTPUTS) + 1]
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
    pytest.importorskip("gradio", reason=NEEDS_GRADIO)
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
    first, size = len(PAGE_OUTPUTS) - 1, len(PANEL_OUTPUTS) - 1  # the states (gr.State) do not travel
    panels = [dict(zip(PANEL_OUTPUTS, outputs[first + k * size:first + (k + 1) * size])) for k in (0, 1)]
    for panel, model in zip(panels, (softmax, csparsemax)):
        expected = translate(model, tokenizer, [source for _, source in lines], num_beams=2, max_new_tokens=8)
        for translation in expected:
            assert f'<span class="translation-text">{translation.text}</span>' in panel["translations"]
        assert cells(panel["heatmap"]) == (lambda shape: shape[0] * shape[1])(table_shape(panel["heatmap"]))
    assert "no fertility" in panels[0]["fertility"] and "fertility bound" in panels[1]["fertility"]
    assert 'class="hm hm-difference"' in outputs[PAGE_OUTPUTS.index("difference")]  # one tokenizer: a difference


def test_the_command_loads_its_models_and_serves_the_page(tokenizer, tmp_path, monkeypatch, capsys):
    pytest.importorskip("gradio", reason=NEEDS_GRADIO)
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
