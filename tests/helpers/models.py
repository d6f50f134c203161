"""Small random models of both families and their inputs: the Transformer (`tiny_config`, `random_model`) and the
LSTM (`rnn_config`, `random_rnn_model`), the configurations the invariant tests run over (`VARIANT_CONFIGS`,
`RNN_CONFIGS`), and right-padded source batches (`source_batch`)."""

import torch

from hf_headattn import (HeadAttnConfig, HeadAttnForConditionalGeneration, HeadAttnRNNConfig,
                         HeadAttnRNNForConditionalGeneration)
from hf_headattn.runtime.attention_registry import ATTENTION_VARIANTS, every_site_placement
from hf_headattn.runtime.configuration_headattn_rnn import ATTENTION_TRANSFORMS


VOCAB = 64
PAD, EOS = 0, 1


def tiny_config(**overrides) -> HeadAttnConfig:
    settings = dict(
        vocab_size=VOCAB,
        d_model=32,
        encoder_layers=2,
        decoder_layers=2,
        encoder_attention_heads=4,
        decoder_attention_heads=4,
        encoder_ffn_dim=64,
        decoder_ffn_dim=64,
        max_position_embeddings=64,
        dropout=0.0,
        pad_token_id=PAD,
        eos_token_id=EOS,
        decoder_start_token_id=PAD,
    )
    settings.update(overrides)
    return HeadAttnConfig(**settings)


def random_model(config: HeadAttnConfig, seed: int = 0, std: float = 0.3) -> HeadAttnForConditionalGeneration:
    """A model with weights large enough that greedy and beam search produce varied, length-varying outputs."""
    torch.manual_seed(seed)
    model = HeadAttnForConditionalGeneration(config)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "layer_norm" not in name:
                parameter.normal_(0.0, std)
        model.final_logits_bias.normal_(0.0, 1.0)
    return model.eval()


def source_batch(lengths=(7, 4, 9), seed: int = 1):
    """Right-padded source ids ending in EOS, and their attention mask."""
    generator = torch.Generator().manual_seed(seed)
    width = max(lengths)
    input_ids = torch.full((len(lengths), width), PAD)
    attention_mask = torch.zeros((len(lengths), width), dtype=torch.long)
    for row, length in enumerate(lengths):
        input_ids[row, : length - 1] = torch.randint(2, VOCAB, (length - 1,), generator=generator)
        input_ids[row, length - 1] = EOS
        attention_mask[row, :length] = 1
    return input_ids, attention_mask


# ------------------------------------------------------------------------------------------------ LSTM
def rnn_config(**overrides) -> HeadAttnRNNConfig:
    settings = dict(vocab_size=VOCAB, embedding_size=16, hidden_size=24, dropout=0.0, pad_token_id=PAD,
                    eos_token_id=EOS, decoder_start_token_id=PAD)
    settings.update(overrides)
    return HeadAttnRNNConfig(**settings)


def random_rnn_model(config: HeadAttnRNNConfig, seed: int = 0, std: float = 0.3,
                     eos_bias: float = 0.0) -> HeadAttnRNNForConditionalGeneration:
    """Weights large enough for varied outputs (like helpers.random_model); `eos_bias` added to EOS's output bias
    so that hypotheses end at varied lengths; a GUIDED fertility table of random integers in 1..3, so that it
    differs from the all-ones default."""
    torch.manual_seed(seed)
    model = HeadAttnRNNForConditionalGeneration(config)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.normal_(0.0, std)
        model.generator.bias.normal_(0.0, 1.0)
        model.generator.bias[EOS] += eos_bias
        source_fertility = model.model.encoder.source_fertility
        if source_fertility is not None and hasattr(source_fertility, "guided_fertility"):
            table = torch.randint(1, 4, (config.vocab_size,), generator=torch.Generator().manual_seed(seed))
            source_fertility.guided_fertility.copy_(table.float())
    return model.eval()


RNN_CONFIGS = {
    "baseline-1x1-general": {},
    "dot": {"attention_score": "dot"},
    "scaled-general-csparsemax": {"attention_score": "scaled_general", "attention_transform": "csparsemax",
                                  "constant_fertility": 1.0},
    "2x1-single-hop": {"num_heads": 2},
    "2x2-dependent": {"num_heads": 2, "num_hops": 2},
    "2x3-independent": {"num_heads": 2, "num_hops": 3, "hop_mode": "independent"},
    "sparsemax": {"attention_transform": "sparsemax"},
    "csoftmax-constant": {"attention_transform": "csoftmax", "constant_fertility": 1.0},
    "csparsemax-guided": {"attention_transform": "csparsemax", "fertility": "guided"},
    # max_fertility 2: expected fertilities of at most 2, so that 10-12 steps exhaust them (infeasible steps included)
    "csparsemax-predicted-no-sink": {"attention_transform": "csparsemax", "fertility": "predicted", "sink": "none",
                                     "fertility_predictor_size": 8, "max_fertility": 2},
    "csparsemax-sink-vector": {"attention_transform": "csparsemax", "sink": "vector", "num_heads": 2},
    "softmax-sink-token-2x2": {"sink_every_transform": True, "num_heads": 2, "num_hops": 2, "encoder_layers": 2},
    "coverage-vector": {"coverage_vector": True, "num_heads": 2},
    "2-encoder-3-decoder-layers": {"encoder_layers": 2, "decoder_layers": 3},
}

# every transform the LSTM takes from the registry (`ATTENTION_TRANSFORMS`) that no config above uses: a new variant's
# LSTM case, with nothing to add here
RNN_CONFIGS.update({
    f"transform-{transform}": {"attention_transform": transform} for transform in ATTENTION_TRANSFORMS
    if all(config.get("attention_transform", "softmax") != transform for config in RNN_CONFIGS.values())
})

# Per config, an EOS bias under which these random models end some hypotheses early and others late or not at
# all (without one most never emit EOS; 2x2-dependent and predicted-no-sink already do), so that the invariants
# also cover finished beams and the filling after EOS.
RNN_EOS_BIAS = {
    "baseline-1x1-general": 2.0, "dot": 1.0, "2x1-single-hop": 3.0, "2x3-independent": 1.5, "sparsemax": 2.0,
    "csoftmax-constant": 2.0, "csparsemax-guided": 2.0, "csparsemax-sink-vector": 1.5, "softmax-sink-token-2x2": 1.0, "coverage-vector": 3.5, "2-encoder-3-decoder-layers": 2.0,
}


# -------------------------------------------------------------------------------------------- variants
# One Transformer per way of placing the variants: what the invariant tests run over (the options' cases here, and every
# registered variant at every site it declares, `{name}-every-site`, below)
VARIANT_CONFIGS = {
    "running_sum": {"cross_attention": {"type": "running_sum", "penalty": 2.0}},
    "mma": {
        "encoder_self_attention": "mma",
        "decoder_self_attention": {"type": "mma", "head_kinds": ["global", "local", "backward", "local"]},
    },
    "mma-no-positions": {"encoder_self_attention": {"type": "mma", "window": 2}, "position_embedding": "none"},
    "dhicm-every-layer-and-site": {
        "encoder_self_attention": {"type": "dhicm", "layers": [0, 1]},
        "decoder_self_attention": {"type": "dhicm", "layers": [0, 1]},
        "cross_attention": {"type": "dhicm", "layers": [0, 1], "score": "mlp"},
    },
    # learned alphas (random weights: a different alpha per head) and a fixed one
    "entmax_alpha-learned-and-fixed": {
        "encoder_self_attention": "entmax_alpha", "decoder_self_attention": {"type": "entmax_alpha", "alpha": 1.75},
        "cross_attention": "entmax_alpha",
    },
    "csoftmax-constant": {"cross_attention": "csoftmax", "constant_fertility": 1.0},
    "csparsemax-guided": {"cross_attention": {"type": "csparsemax", "exhaustion": 0.5}, "fertility": "guided"},
    "csparsemax-predicted-no-sink": {"cross_attention": {"type": "csparsemax", "sink": False}, "fertility": "predicted"},
    "multihop-dependent-2-hops": {"cross_attention": {"type": "multihop", "hops": 2}},
    "multihop-independent": {"cross_attention": {"type": "multihop", "hop_mode": "independent", "layers": [1]}},
    "dhicm-pruned": {
        "encoder_self_attention": "dhicm",
        "cross_attention": "dhicm",
        "pruned_heads": {"encoder.layers.1.self_attn": [2], "decoder.layers.1.encoder_attn": [0, 3]},
    },
}

# Every registered variant at every site it declares (`every_site_placement`): a new variant's cases, with nothing to
# add here
TRANSFORMER_VARIANTS = {
    **{name: every_site_placement(name, num_heads=4) for name in ATTENTION_VARIANTS},
    "csparsemax-no-sink": dict(cross_attention={"type": "csparsemax", "sink": False}, constant_fertility=2.0),
}
VARIANT_CONFIGS.update({f"{name}-every-site": every_site_placement(name, num_heads=4) for name in ATTENTION_VARIANTS})
