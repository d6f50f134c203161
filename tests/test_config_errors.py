"""Bad configurations fail at construction with a message naming the bad value and what is accepted."""

import pytest

from hf_headattn import HeadAttnConfig, HeadAttnRNNConfig

from helpers import tiny_config


@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"cross_attention": "softmaxx"}, r"Unknown attention variant 'softmaxx'.*registered variants are: .*softmax"),
        ({"encoder_self_attention": {"type": "nope"}}, r"Unknown attention variant 'nope' for `encoder_self_attention`"),
        ({"cross_attention": {"type": "running_sum", "penalti": 1.0}},
         r"does not take option\(s\) penalti; accepted options: aux_weight, penalty"),
        ({"cross_attention": {"type": "softmax", "window": 2}}, r"does not take option\(s\) window; accepted options: none"),
        ({"cross_attention": {"type": "softmax", "layers": [2]}},
         r"Layer index 2 of `cross_attention` is out of range; this site has 2 layers, so indices in \[-2, 1\]"),
        ({"encoder_self_attention": {"type": "softmax", "layers": [-3]}}, r"Layer index -3 of `encoder_self_attention`"),
        ({"cross_attention": {"type": "softmax", "layers": [0, -2]}}, r"lists a layer twice"),
        ({"cross_attention": [{"type": "softmax", "layers": [0]}, {"type": "running_sum", "layers": [0]}]},
         r"Layer 0 of `cross_attention` is given more than one attention variant"),
        ({"encoder_self_attention": "running_sum"},
         r"'running_sum' cannot be used at `encoder_self_attention`; it supports: cross_attention"),
        ({"cross_attention": {"layers": [0]}}, r"has no 'type'"),
        ({"cross_attention": 3}, r"`cross_attention` must be a variant name, a dict"),
        ({"cross_attention": {"type": "running_sum", "penalty": "high"}}, r"option `penalty` must be a finite number, got 'high'"),
        ({"encoder_attention_heads": 5}, r"`encoder_attention_heads`=5 does not divide d_model=32; heads that divide it: \[1, 2, 4, 8, 16, 32\]"),
        ({"decoder_attention_heads": 3}, r"`decoder_attention_heads`=3 does not divide d_model=32"),
        ({"d_model": 0}, r"`d_model` must be a positive integer, got 0"),
        ({"encoder_layers": 2.5}, r"`encoder_layers` must be a positive integer, got 2.5"),
        ({"dropout": 1.5}, r"`dropout` must be a number in \[0, 1\), got 1.5"),
        ({"label_smoothing": -0.1}, r"`label_smoothing` must be a number in \[0, 1\), got -0.1"),
        ({"activation_function": "swishy"}, r"Unknown activation_function 'swishy'; accepted: .*gelu"),
        ({"position_embedding": "rotary"}, r"Unknown position_embedding 'rotary'; accepted: sinusoidal, none"),
        ({"pad_token_id": 64}, r"`pad_token_id` must be an integer in \[0, 64\) for this vocabulary, got 64"),
        ({"decoder_vocab_size": 50}, r"decoder_vocab_size=50 differs from vocab_size=64 but share_encoder_decoder_embeddings=True"),
    ],
)
def test_bad_config_raises_clear_error(overrides, message):
    with pytest.raises(ValueError, match=message):
        tiny_config(**overrides)


NAN, INF = float("nan"), float("inf")


@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"cross_attention": {"type": "running_sum", "penalty": NAN}},
         r"running_sum option `penalty` must be a finite number, got nan"),
        ({"cross_attention": {"type": "running_sum", "penalty": -INF}},
         r"option `penalty` must be a finite number, got -inf"),
        ({"cross_attention": {"type": "running_sum", "aux_weight": INF}},
         r"option `aux_weight` must be a finite number >= 0, got inf"),
        ({"cross_attention": {"type": "running_sum", "aux_weight": -0.5}},
         r"option `aux_weight` must be a finite number >= 0, got -0.5"),
        ({"cross_attention": {"type": "csoftmax", "exhaustion": INF}},
         r"csoftmax option `exhaustion` .* must be a finite number >= 0, got inf"),
        ({"cross_attention": {"type": "csparsemax", "exhaustion": NAN}},
         r"csparsemax option `exhaustion` .* must be a finite number >= 0, got nan"),
        ({"cross_attention": {"type": "dhicm", "kl_weight": INF}},
         r"dhicm option `kl_weight` .* must be a finite number >= 0, got inf"),
        ({"cross_attention": {"type": "dhicm", "dropout": NAN}},
         r"dhicm option `dropout` must be a number in \[0, 1\)"),
        ({"cross_attention": "csoftmax", "constant_fertility": INF},
         r"`constant_fertility` must be a finite number > 0, got inf"),
        ({"constant_fertility": NAN}, r"`constant_fertility` must be a finite number > 0, got nan"),
        ({"init_std": -1}, r"`init_std` must be a finite number > 0, got -1"),
        ({"init_std": NAN}, r"`init_std` must be a finite number > 0, got nan"),
        ({"init_std": INF}, r"`init_std` must be a finite number > 0, got inf"),
        ({"init_std": "0.02"}, r"`init_std` must be a finite number > 0, got '0.02'"),
        ({"dropout": NAN}, r"`dropout` must be a number in \[0, 1\), got nan"),
        ({"attention_dropout": INF}, r"`attention_dropout` must be a number in \[0, 1\), got inf"),
        ({"label_smoothing": NAN}, r"`label_smoothing` must be a number in \[0, 1\), got nan"),
        ({"encoder_layerdrop": -INF}, r"`encoder_layerdrop` must be a number in \[0, 1\), got -inf"),
    ],
)
def test_non_finite_and_out_of_range_numbers_fail_at_construction(overrides, message):
    with pytest.raises(ValueError, match=message):
        tiny_config(**overrides)


@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"init_range": NAN}, r"`init_range` must be a finite number > 0, got nan"),
        ({"init_range": INF}, r"`init_range` must be a finite number > 0, got inf"),
        ({"init_range": 0}, r"`init_range` must be a finite number > 0, got 0"),
        ({"exhaustion": NAN}, r"`exhaustion` .* must be a finite number >= 0, got nan"),
        ({"exhaustion": INF}, r"`exhaustion` .* must be a finite number >= 0, got inf"),
        ({"attention_transform": "csparsemax", "constant_fertility": INF},
         r"`constant_fertility` must be a finite number > 0, got inf"),
        ({"constant_fertility": -2.0}, r"`constant_fertility` must be a finite number > 0, got -2.0"),
        ({"dropout": NAN}, r"`dropout` must be a number in \[0, 1\), got nan"),
        ({"label_smoothing": INF}, r"`label_smoothing` must be a number in \[0, 1\), got inf"),
    ],
)
def test_lstm_config_numbers_fail_at_construction(overrides, message):
    with pytest.raises(ValueError, match=message):
        HeadAttnRNNConfig(vocab_size=64, embedding_size=16, hidden_size=16, **overrides)


def test_valid_spec_forms_resolve_per_layer():
    config = tiny_config(
        decoder_layers=3,
        cross_attention=[{"type": "running_sum", "layers": [-1], "penalty": 0.5}, {"type": "softmax", "layers": [0]}],
    )
    assert config.attention_variant("cross_attention", 2) == ("running_sum", {"penalty": 0.5})
    assert config.attention_variant("cross_attention", 1) == ("softmax", {})
    assert config.attention_variant("decoder_self_attention", 0) == ("softmax", {})
    with pytest.raises(ValueError, match="Unknown attention site 'encoder'"):
        config.attention_variant("encoder", 0)


def test_spec_round_trips_through_json(tmp_path):
    config = tiny_config(cross_attention={"type": "running_sum", "layers": [1], "penalty": 0.5})
    config.save_pretrained(tmp_path)
    reloaded = HeadAttnConfig.from_pretrained(tmp_path)
    assert reloaded.cross_attention == {"type": "running_sum", "layers": [1], "penalty": 0.5}
    assert reloaded.attention_variant("cross_attention", 1) == ("running_sum", {"penalty": 0.5})
    assert reloaded.auto_map["AutoModelForSeq2SeqLM"] == "modeling_headattn.HeadAttnForConditionalGeneration"
