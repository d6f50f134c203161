"""Small models and inputs shared by the tests."""

import torch

from hf_headattn import HeadAttnConfig, HeadAttnForConditionalGeneration


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
