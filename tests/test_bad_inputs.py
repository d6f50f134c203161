"""Bad inputs across the public API (issue 17): forward and generate of both model families, the translation pipeline,
configs and the sparse kernels. Each case gives the error type and a message that names the bad value (or
argument and shape); none is silent, none fails deep inside with an IndexError or a broadcast error."""

import math

import pytest
import torch
from transformers import GenerationConfig

from hf_headattn import HeadAttnModel, TranslationPipeline, csoftmax, csparsemax
from hf_headattn import sparsemax, train_tokenizer
from hf_headattn.decoding import fast_generate
from hf_headattn.toy_corpus import make_toy_corpus

from helpers import EOS, PAD, VOCAB, random_model, random_rnn_model, rnn_config, source_batch, tiny_config


@pytest.fixture(scope="module")
def transformer():
    return random_model(tiny_config(), std=0.1)


@pytest.fixture(scope="module")
def rnn():
    return random_rnn_model(rnn_config(), std=0.1)


@pytest.fixture(scope="module")
def bare_model():
    torch.manual_seed(0)
    return HeadAttnModel(tiny_config()).eval()


IDS, MASK = source_batch((5, 3, 4))  # [3, 5]
TARGET = torch.tensor([[PAD, 5, 6], [PAD, 7, 8], [PAD, 9, 10]])
LABELS = torch.tensor([[5, 6, EOS], [7, 8, EOS], [9, EOS, -100]])


def with_value(tensor, position, value):
    changed = tensor.clone()
    changed[position] = value
    return changed


# (case id, keyword arguments to forward, error type, message pattern). Without `decoder_input_ids` or `labels` the
# case gets the good TARGET as decoder input.
FORWARD_CASES = [
    # source ids
    ("ids-equal-to-vocab", dict(input_ids=with_value(IDS, (1, 0), VOCAB)), ValueError,
     r"`input_ids` holds 64 at position \(1, 0\), outside the vocabulary: token ids must be in \[0, 64\)"),
    ("ids-far-above-vocab", dict(input_ids=with_value(IDS, (0, 2), 10_000)), ValueError, r"`input_ids` holds 10000"),
    ("negative-ids", dict(input_ids=with_value(IDS, (2, 1), -1)), ValueError, r"`input_ids` holds -1 at position \(2, 1\)"),
    ("ids-minus-100", dict(input_ids=with_value(IDS, (0, 0), -100)), ValueError, r"`input_ids` holds -100"),
    ("1d-ids", dict(input_ids=IDS[0], attention_mask=None), ValueError,
     r"`input_ids` must be 2-D token ids \[batch, length\], got shape \(5,\).*ids\[None\]"),
    ("3d-ids", dict(input_ids=IDS[None], attention_mask=None), ValueError, r"`input_ids` must be 2-D.*shape \(1, 3, 5\)"),
    ("0d-ids", dict(input_ids=torch.tensor(5), attention_mask=None), ValueError, r"`input_ids` must be 2-D.*shape \(\)"),
    ("float-ids", dict(input_ids=IDS.float()), ValueError, r"`input_ids` must hold integer token ids.*torch.float32"),
    ("bool-ids", dict(input_ids=IDS.bool()), ValueError, r"`input_ids` must hold integer.*torch.bool"),
    ("int16-ids", dict(input_ids=IDS.to(torch.int16)), ValueError, r"`input_ids`.*dtype torch.int64 or torch.int32.*int16"),
    ("list-ids", dict(input_ids=IDS.tolist()), ValueError, r"`input_ids` must be a torch.Tensor.*got list"),
    ("empty-source", dict(input_ids=IDS[:, :0], attention_mask=MASK[:, :0]), ValueError,
     r"`input_ids` is empty \(shape \(3, 0\).*at least one sentence of at least one token"),
    ("empty-batch", dict(input_ids=IDS[:0], attention_mask=MASK[:0], decoder_input_ids=TARGET[:0]), ValueError,
     r"`input_ids` is empty \(shape \(0, 5\)"),
    ("no-source", dict(input_ids=None), ValueError, r"Pass the source: `input_ids`"),
    # source mask
    ("mask-of-halves", dict(attention_mask=MASK * 0.5), ValueError,
     r"`attention_mask` holds 0.5 at position \(0, 0\): a mask holds 0 \(padding\) or 1"),
    ("mask-of-twos", dict(attention_mask=MASK * 2), ValueError, r"`attention_mask` holds 2 at position \(0, 0\)"),
    ("negative-mask", dict(attention_mask=-MASK), ValueError, r"`attention_mask` holds -1"),
    ("nan-mask", dict(attention_mask=with_value(MASK.float(), (1, 1), math.nan)), ValueError,
     r"`attention_mask` holds nan at position \(1, 1\)"),
    ("mask-wrong-length", dict(attention_mask=MASK[:, :4]), ValueError,
     r"`attention_mask` has shape \(3, 4\); it must match `input_ids` \(3, 5\)"),
    ("mask-wrong-batch", dict(attention_mask=MASK[:2]), ValueError, r"`attention_mask` has shape \(2, 5\).*\(3, 5\)"),
    ("1d-mask", dict(attention_mask=MASK[0]), ValueError, r"`attention_mask` has shape \(5,\)"),
    ("transposed-mask", dict(attention_mask=MASK.T), ValueError, r"`attention_mask` has shape \(5, 3\)"),
    ("list-mask", dict(attention_mask=MASK.tolist()), ValueError, r"`attention_mask` must be a torch.Tensor.*list"),
    # decoder inputs
    ("decoder-ids-equal-to-vocab", dict(decoder_input_ids=with_value(TARGET, (2, 2), VOCAB)), ValueError,
     r"`decoder_input_ids` holds 64 at position \(2, 2\).*\[0, 64\)"),
    ("negative-decoder-ids", dict(decoder_input_ids=with_value(TARGET, (0, 1), -5)), ValueError,
     r"`decoder_input_ids` holds -5"),
    ("1d-decoder-ids", dict(decoder_input_ids=TARGET[0]), ValueError, r"`decoder_input_ids` must be 2-D.*\(3,\)"),
    ("float-decoder-ids", dict(decoder_input_ids=TARGET.double()), ValueError,
     r"`decoder_input_ids` must hold integer.*float64"),
    ("decoder-batch-mismatch", dict(decoder_input_ids=TARGET[:2]), ValueError,
     r"`decoder_input_ids` has batch size 2 but the source has 3"),
    ("empty-decoder-ids", dict(decoder_input_ids=TARGET[:, :0]), ValueError, r"`decoder_input_ids` is empty"),
    ("decoder-mask-wrong-length", dict(decoder_attention_mask=torch.ones(3, 2, dtype=torch.long)), ValueError,
     r"`decoder_attention_mask` has shape \(3, 2\); it must match `decoder_input_ids`.*\(3, 3\)"),
    ("decoder-mask-of-halves", dict(decoder_attention_mask=torch.full((3, 3), 0.5)), ValueError,
     r"`decoder_attention_mask` holds 0.5"),
    # labels
    ("labels-equal-to-vocab", dict(decoder_input_ids=None, labels=with_value(LABELS, (0, 0), VOCAB)), ValueError,
     r"`labels` holds 64 at position \(0, 0\).*\[0, 64\) or -100 \(ignored\)"),
    ("labels-minus-one", dict(decoder_input_ids=None, labels=with_value(LABELS, (1, 2), -1)), ValueError,
     r"`labels` holds -1 at position \(1, 2\)"),
    ("1d-labels", dict(decoder_input_ids=None, labels=LABELS[0]), ValueError, r"`labels` must be 2-D.*\(3,\)"),
    ("int32-labels", dict(decoder_input_ids=None, labels=LABELS.int()), ValueError,
     r"`labels` must hold integer token ids of dtype torch.int64, got .*torch.int32"),
    ("float-labels", dict(decoder_input_ids=None, labels=LABELS.float()), ValueError, r"`labels`.*torch.float32"),
    ("labels-longer-than-decoder-ids", dict(decoder_input_ids=TARGET, labels=torch.cat([LABELS, LABELS], dim=1)), ValueError,
     r"`labels` has shape \(3, 6\); it must match `decoder_input_ids` \(3, 3\)"),
    ("labels-batch-mismatch", dict(decoder_input_ids=None, labels=LABELS[:1]), ValueError,
     r"`labels` has batch size 1 but the source has 3"),
]

TRANSFORMER_ONLY_CASES = [
    ("ids-and-embeds", dict(inputs_embeds=torch.zeros(3, 5, 32)), ValueError,
     r"Pass either `input_ids` or `inputs_embeds`, not both"),
    ("2d-embeds", dict(input_ids=None, inputs_embeds=torch.zeros(3, 32)), ValueError,
     r"`inputs_embeds` must be floating-point embeddings \[batch, length, 32\].*shape \(3, 32\)"),
    ("embeds-wrong-width", dict(input_ids=None, inputs_embeds=torch.zeros(3, 5, 16)), ValueError,
     r"`inputs_embeds`.*\[batch, length, 32\] \(the model width\), got shape \(3, 5, 16\)"),
    ("integer-embeds", dict(input_ids=None, inputs_embeds=torch.zeros(3, 5, 32, dtype=torch.long)), ValueError,
     r"`inputs_embeds` must be floating-point.*torch.int64"),
    ("embeds-mask-mismatch", dict(input_ids=None, inputs_embeds=torch.zeros(3, 4, 32)), ValueError,
     r"`attention_mask` has shape \(3, 5\); it must match `inputs_embeds`' \[batch, length\] \(3, 4\)"),
    ("decoder-ids-and-embeds", dict(decoder_inputs_embeds=torch.zeros(3, 3, 32)), ValueError,
     r"Pass either `decoder_input_ids` or `decoder_inputs_embeds`, not both"),
    ("decoder-embeds-wrong-width", dict(decoder_input_ids=None, decoder_inputs_embeds=torch.zeros(3, 3, 31)), ValueError,
     r"`decoder_inputs_embeds`.*got shape \(3, 3, 31\)"),
    ("labels-vs-decoder-embeds", dict(decoder_input_ids=None, decoder_inputs_embeds=torch.zeros(3, 4, 32),
                                      labels=LABELS), ValueError,
     r"`labels` has shape \(3, 3\); it must match `decoder_inputs_embeds`' \[batch, length\] \(3, 4\)"),
]

RNN_ONLY_CASES = [  # the LSTM's forward takes no embeddings at all
    ("embeds-to-the-lstm", dict(input_ids=None, inputs_embeds=torch.zeros(3, 5, 16)), (ValueError, TypeError),
     r"inputs_embeds"),
]


def call_forward(model, arguments):
    arguments = dict(arguments)
    arguments.setdefault("input_ids", IDS)
    arguments.setdefault("attention_mask", MASK)
    if "labels" not in arguments:
        arguments.setdefault("decoder_input_ids", TARGET)
    arguments = {name: value for name, value in arguments.items() if value is not None or name == "input_ids"}
    with torch.no_grad():
        return model(**arguments)


@pytest.mark.parametrize("arguments, error, message", [case[1:] for case in FORWARD_CASES + TRANSFORMER_ONLY_CASES],
                         ids=[case[0] for case in FORWARD_CASES + TRANSFORMER_ONLY_CASES])
def test_transformer_forward_refuses(transformer, arguments, error, message):
    with pytest.raises(error, match=message):
        call_forward(transformer, arguments)


@pytest.mark.parametrize("arguments, error, message", [case[1:] for case in FORWARD_CASES + RNN_ONLY_CASES],
                         ids=[case[0] for case in FORWARD_CASES + RNN_ONLY_CASES])
def test_rnn_forward_refuses(rnn, arguments, error, message):
    with pytest.raises(error, match=message):
        call_forward(rnn, arguments)


@pytest.mark.parametrize("arguments, error, message",
                         [case[1:] for case in FORWARD_CASES[:23]],  # source and mask cases: no labels in a bare model
                         ids=[case[0] for case in FORWARD_CASES[:23]])
def test_bare_transformer_forward_refuses(bare_model, arguments, error, message):
    with pytest.raises(error, match=message):
        call_forward(bare_model, arguments)


def test_good_inputs_pass_and_the_checks_change_nothing(transformer, rnn):
    """The checked forward gives what the unchecked one (inside `inputs_checked_by_caller`) gives, with -100 labels
    and integer, bool and float 0/1 masks all accepted."""
    from hf_headattn.runtime.seq2seq_common import inputs_checked_by_caller

    for model in (transformer, rnn):
        for mask in (MASK, MASK.bool(), MASK.float(), MASK.int()):
            checked = call_forward(model, dict(attention_mask=mask, decoder_input_ids=None, labels=LABELS))
            with inputs_checked_by_caller():
                unchecked = call_forward(model, dict(decoder_input_ids=None, labels=LABELS))
            torch.testing.assert_close(checked.logits, unchecked.logits)
            assert torch.isfinite(checked.loss)


# ------------------------------------------------------------------------------------------------ generate
GENERATE_CASES = [
    ("ids-equal-to-vocab", dict(input_ids=with_value(IDS, (0, 0), VOCAB)), ValueError, r"`input_ids` holds 64"),
    ("negative-ids", dict(input_ids=with_value(IDS, (0, 0), -3)), ValueError, r"`input_ids` holds -3"),
    ("1d-ids", dict(input_ids=IDS[0], attention_mask=None), ValueError, r"`input_ids` must be 2-D.*\(5,\)"),
    ("float-ids", dict(input_ids=IDS.float()), ValueError, r"`input_ids` must hold integer.*float32"),
    ("empty-source", dict(input_ids=IDS[:, :0], attention_mask=MASK[:, :0]), ValueError, r"`input_ids` is empty"),
    ("mask-of-halves", dict(attention_mask=MASK * 0.5), ValueError, r"`attention_mask` holds 0.5"),
    ("mask-wrong-length", dict(attention_mask=MASK[:, 1:]), ValueError, r"`attention_mask` has shape \(3, 4\)"),
    ("prompt-out-of-vocab", dict(decoder_input_ids=torch.full((3, 1), 99)), ValueError,
     r"`decoder_input_ids` holds 99"),
    ("prompt-batch-mismatch", dict(decoder_input_ids=torch.zeros(2, 1, dtype=torch.long)), ValueError,
     r"`decoder_input_ids` has batch size 2 but the source has 3"),
]


def call_generate(model, arguments, positional):
    arguments = dict(arguments)
    source = arguments.pop("input_ids", IDS)
    arguments.setdefault("attention_mask", MASK)
    arguments = {name: value for name, value in arguments.items() if value is not None}
    with torch.no_grad():
        if positional:
            return model.generate(source, max_new_tokens=3, **arguments)
        return model.generate(input_ids=source, max_new_tokens=3, num_beams=2, **arguments)


@pytest.mark.parametrize("family", ["transformer", "rnn"])
@pytest.mark.parametrize("arguments, error, message", [case[1:] for case in GENERATE_CASES],
                         ids=[case[0] for case in GENERATE_CASES])
def test_generate_refuses(request, family, arguments, error, message):
    model = request.getfixturevalue(family)
    with pytest.raises(error, match=message):
        call_generate(model, arguments, positional=family == "transformer")


# counts Transformers 5.24's generate itself divides by or sizes tensors with: num_beams=0 was a ZeroDivisionError,
# -1 a negative dimension, 2.0 a TypeError in repeat_interleave, num_return_sequences=0 one sequence (greedy)
COUNT_CASES = [
    ("zero-beams", dict(num_beams=0), r"`num_beams` must be a whole number >= 1 \(1: greedy .*\), got 0"),
    ("negative-beams", dict(num_beams=-1), r"`num_beams` must be a whole number >= 1 .*, got -1"),
    ("float-beams", dict(num_beams=2.0), r"`num_beams` must be a whole number >= 1 .*, got 2.0"),
    ("bool-beams", dict(num_beams=True), r"`num_beams` must be a whole number >= 1 .*, got True"),
    ("zero-sequences", dict(num_return_sequences=0), r"`num_return_sequences` must be a whole number >= 1 .*got 0"),
    ("in-generation-config", dict(generation_config=GenerationConfig(num_beams=0)), r"`num_beams`.*got 0"),
]


@pytest.mark.parametrize("family", ["transformer", "rnn"])
@pytest.mark.parametrize("arguments, message", [case[1:] for case in COUNT_CASES],
                         ids=[case[0] for case in COUNT_CASES])
def test_generate_and_the_fast_path_refuse_counts_below_one(request, family, arguments, message):
    model = request.getfixturevalue(family)
    with pytest.raises(ValueError, match=message):
        model.generate(IDS, attention_mask=MASK, max_new_tokens=3, **arguments)
    with pytest.raises(ValueError, match=message):
        fast_generate(model, IDS, MASK, max_new_tokens=3, **arguments)


def test_the_fast_path_refuses_a_max_length_that_leaves_no_token_as_generate_does(transformer):
    for max_length in (0, 1):
        with pytest.raises(ValueError) as refused:
            transformer.generate(IDS, attention_mask=MASK, max_length=max_length)
        with pytest.raises(ValueError) as refused_too:  # an IndexError before
            fast_generate(transformer, IDS, MASK, max_length=max_length)
        assert str(refused_too.value) == str(refused.value) and "`max_length` is set to" in str(refused.value)


def test_generate_checks_the_source_once_not_at_every_step(transformer, rnn, monkeypatch):
    from hf_headattn.runtime import modeling_headattn, modeling_headattn_rnn, seq2seq_common

    calls = []
    original = seq2seq_common.check_seq2seq_inputs

    def counting(**arguments):
        calls.append(arguments)
        return original(**arguments)

    for module in (modeling_headattn, modeling_headattn_rnn):
        monkeypatch.setattr(module, "check_seq2seq_inputs", counting)
    for model in (transformer, rnn):
        calls.clear()
        with torch.no_grad():
            generated = model.generate(IDS, attention_mask=MASK, max_new_tokens=4, num_beams=2, min_new_tokens=4)
        assert generated.shape[1] == 5 and len(calls) == 1 and calls[0]["input_ids"] is IDS


def test_generate_with_head_importances_and_coverage_penalty_check_their_source():
    dhicm = random_model(tiny_config(cross_attention="dhicm"), std=0.1)
    with pytest.raises(ValueError, match=r"`input_ids` holds 64"):
        dhicm.generate(with_value(IDS, (0, 0), VOCAB), attention_mask=MASK, output_head_importances=True)
    lstm = random_rnn_model(rnn_config(), std=0.1)
    with pytest.raises(ValueError, match=r"`attention_mask` holds 0.5"):
        lstm.generate(IDS, attention_mask=MASK * 0.5, num_beams=2, coverage_penalty=0.2)


# ------------------------------------------------------------------------------------------------ pipeline
@pytest.fixture(scope="module")
def translator():
    pairs = make_toy_corpus(200, seed=1)
    tokenizer = train_tokenizer(texts=[text for pair in pairs for text in pair], vocab_size=120, model="bpe")
    return TranslationPipeline(model=random_model(tiny_config(vocab_size=len(tokenizer)), std=0.1), tokenizer=tokenizer)


@pytest.mark.parametrize("inputs, message", [
    (None, r"got NoneType"),
    (3, r"got int"),
    (b"der hund", r"got bytes"),
    (["der hund .", None], r"NoneType"),
    (["der hund .", 7], r"int"),
    ({"text": "der hund"}, r"got dict"),
], ids=["none", "int", "bytes", "none-in-list", "int-in-list", "dict"])
def test_pipeline_refuses_non_strings(translator, inputs, message):
    with pytest.raises(TypeError, match=message):
        translator(inputs, max_new_tokens=2)


def test_pipeline_refuses_counts_below_one_before_tokenising(translator, monkeypatch):
    monkeypatch.setattr(translator, "preprocess", lambda *args, **kwargs: pytest.fail("tokenised first"))
    with pytest.raises(ValueError, match=r"`num_beams` must be a whole number >= 1 .*got 0"):  # ZeroDivisionError
        translator(["der hund .", ""], num_beams=0)
    with pytest.raises(ValueError, match=r"`num_return_sequences` must be a whole number >= 1 .*got 0"):
        translator("", num_return_sequences=0)  # was [] for an empty input


# ------------------------------------------------------------------------------------------------ configs
@pytest.mark.parametrize("overrides, message", [
    ({"cross_attention": {"type": "running_sum", "penalty": math.nan}}, r"`penalty` must be a finite number.*nan"),
    ({"cross_attention": "csoftmax", "constant_fertility": math.inf}, r"`constant_fertility`.*inf"),
    ({"cross_attention": "csoftmax", "constant_fertility": -1.0}, r"`constant_fertility`.*-1.0"),
    ({"cross_attention": "csoftmax", "fertility": "learned"}, r"Unknown fertility 'learned'"),
    ({"init_std": -1.0}, r"`init_std`.*-1.0"),
    ({"init_std": math.nan}, r"`init_std`.*nan"),
    ({"dropout": math.nan}, r"`dropout`.*nan"),
    ({"label_smoothing": 1.0}, r"`label_smoothing` must be a number in \[0, 1\), got 1.0"),
    ({"vocab_size": 0}, r"`vocab_size`.*0"),
    ({"d_model": -32}, r"`d_model` must be a positive integer, got -32"),
], ids=["penalty-nan", "fertility-inf", "fertility-negative", "fertility-unknown", "init-std-negative",
        "init-std-nan", "dropout-nan", "label-smoothing-1", "vocab-0", "d-model-negative"])
def test_transformer_config_refuses(overrides, message):
    with pytest.raises(ValueError, match=message):
        tiny_config(**overrides)


@pytest.mark.parametrize("overrides, message", [
    ({"exhaustion": math.nan, "attention_transform": "csoftmax"}, r"`exhaustion`.*nan"),
    ({"init_range": math.nan}, r"`init_range`.*nan"),
    ({"init_range": -0.1}, r"`init_range`.*-0.1"),
    ({"hidden_size": 25}, r"`hidden_size` must be even.*25"),
    ({"attention_transform": "entmax"}, r"Unknown attention_transform 'entmax'"),
    ({"attention_score": "concat"}, r"Unknown attention_score 'concat'"),
    ({"num_heads": 2, "attention_score": "dot"}, r"attention_score='dot' has no per-head W_a"),
], ids=["exhaustion-nan", "init-range-nan", "init-range-negative", "odd-hidden", "unknown-transform",
        "unknown-score", "dot-with-heads"])
def test_rnn_config_refuses(overrides, message):
    with pytest.raises(ValueError, match=message):
        rnn_config(**overrides)


# ------------------------------------------------------------------------------------------------ kernels
Z = torch.randn(2, 4, generator=torch.Generator().manual_seed(0))


@pytest.mark.parametrize("call, error, message", [
    (lambda: sparsemax(torch.ones(2, 4, dtype=torch.long)), TypeError, r"floating-point tensor, got Tensor torch.int64"),
    (lambda: sparsemax([1.0, 2.0]), TypeError, r"floating-point tensor, got list"),
    (lambda: sparsemax(torch.tensor(1.0)), ValueError, r"at least one dimension"),
    (lambda: sparsemax(Z, dim=5), IndexError, r"dim 5 is out of range for 2-D scores; accepted: -2 to 1"),
    (lambda: sparsemax(Z, dim=-3), IndexError, r"dim -3 is out of range"),
    (lambda: sparsemax(Z, mask=torch.ones(2, 4, dtype=torch.long)), TypeError, r"mask must be a bool tensor"),
    (lambda: sparsemax(Z, mask=torch.ones(3, 4, dtype=torch.bool)), ValueError,
     r"must broadcast to one shape; got z \(2, 4\), mask \(3, 4\)"),
    (lambda: csoftmax(Z, torch.ones(3)), ValueError, r"got z \(2, 4\), u \(3,\)"),
    (lambda: csparsemax(Z, torch.ones(2, 5)), ValueError, r"u \(2, 5\)"),
    (lambda: csoftmax(Z, None), TypeError, r"u \(the upper bounds.*\) is required"),
    (lambda: csparsemax(Z, "1"), TypeError, r"u \(the upper bounds\) must be a tensor or a number, got str '1'"),
    (lambda: csparsemax(Z, torch.ones(2, 4), dim=2), IndexError, r"dim 2 is out of range"),
], ids=["int-scores", "list-scores", "0d-scores", "dim-5", "dim-minus-3", "int-mask", "mask-shape", "csoftmax-u-shape",
        "csparsemax-u-shape", "u-none", "u-string", "csparsemax-dim-2"])
def test_kernels_refuse(call, error, message):
    with pytest.raises(error, match=message):
        call()


def test_kernels_show_nan_scores_and_bounds_as_nan_rows():
    """Not an error but never silent: NaN in the scores or bounds comes out as a NaN row, as from torch.softmax."""
    scores = with_value(Z, (0, 1), math.nan)
    for output in (sparsemax(scores), csoftmax(scores, torch.ones(2, 4)), csparsemax(scores, torch.ones(2, 4)),
                   csparsemax(Z, with_value(torch.ones(2, 4), (1, 0), math.nan))):
        assert output.isnan().all(dim=-1).tolist() in ([True, False], [False, True])


def test_checked_forward_keeps_its_signature(transformer, rnn):
    """Trainer (unused-column removal) and generate (model kwargs) read forward's parameters through the decorator."""
    import inspect

    for model in (transformer, rnn):
        parameters = inspect.signature(model.forward).parameters
        assert {"input_ids", "attention_mask", "decoder_input_ids", "labels", "num_items_in_batch"} <= set(parameters)
