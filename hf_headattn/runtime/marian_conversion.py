"""The Marian weight conversion: a `MarianMTModel` as an equivalent softmax `HeadAttnForConditionalGeneration` and back
(the model's `from_marian` and `to_marian`). Both models name their weights alike, except that this one keeps each
layer's feed-forward in its own module (`ffn.fc1`, `ffn.fc2`), and neither saves the sinusoidal position table."""

import copy

from .attention_base import ENCODER_SELF_ATTENTION, SITES
from .attention_registry import get_attention_variant
from .configuration_headattn import HeadAttnConfig


def convert_from_marian(model_class, model_or_path, **config_overrides):
    """Build an equivalent softmax model from a `MarianMTModel` (an instance, a local folder or a Hub id):
    same config, same weights, same generation config. `config_overrides` (e.g. an attention spec) are
    applied on top; parameters a variant adds keep their fresh initialisation. Returns a `model_class`
    (`HeadAttnForConditionalGeneration.from_marian` passes its class) in Marian's dtype, in eval mode."""
    from transformers import MarianMTModel

    marian = model_or_path if isinstance(model_or_path, MarianMTModel) else MarianMTModel.from_pretrained(model_or_path)
    source = marian.config
    config = HeadAttnConfig(
        vocab_size=source.vocab_size,
        decoder_vocab_size=source.decoder_vocab_size,
        d_model=source.d_model,
        encoder_layers=source.encoder_layers,
        decoder_layers=source.decoder_layers,
        encoder_attention_heads=source.encoder_attention_heads,
        decoder_attention_heads=source.decoder_attention_heads,
        encoder_ffn_dim=source.encoder_ffn_dim,
        decoder_ffn_dim=source.decoder_ffn_dim,
        activation_function=source.activation_function,
        dropout=source.dropout,
        attention_dropout=source.attention_dropout,
        activation_dropout=source.activation_dropout,
        encoder_layerdrop=source.encoder_layerdrop,
        decoder_layerdrop=source.decoder_layerdrop,
        max_position_embeddings=source.max_position_embeddings,
        position_embedding="sinusoidal",
        scale_embedding=source.scale_embedding,
        share_encoder_decoder_embeddings=source.share_encoder_decoder_embeddings,
        tie_word_embeddings=source.tie_word_embeddings,
        init_std=source.init_std,
        pad_token_id=source.pad_token_id,
        eos_token_id=source.eos_token_id,
        decoder_start_token_id=source.decoder_start_token_id,
        **config_overrides,
    )
    model = model_class(config)
    state = {_marian_key_to_headattn(key): value for key, value in marian.state_dict().items()}
    state = {key: value for key, value in state.items() if "embed_positions" not in key}
    missing, unexpected = model.load_state_dict(state, strict=False)
    if unexpected:
        raise ValueError(f"from_marian: Marian weights with no place in this model: {unexpected}")
    known_new = ("variant.", "embed_positions")
    really_missing = [key for key in missing if not any(part in key for part in known_new)]
    if really_missing:
        raise ValueError(f"from_marian: weights missing from the Marian checkpoint: {really_missing}")
    model.generation_config = copy.deepcopy(marian.generation_config)
    return model.to(marian.dtype).eval()


def convert_to_marian(model):
    """The inverse of `convert_from_marian`: `model` (a `HeadAttnForConditionalGeneration`) as a `MarianMTModel` with
    the same config, weights and generation config, so the same logits (e.g. for CTranslate2's or Optimum's Marian
    converters).

    Raises:
        ValueError: a model Marian cannot express, naming what: an attention variant that is not `exportable`
            (softmax is; with its site and layer), pruned heads, or positions other than Marian's sinusoidal table.
    """
    from transformers import MarianConfig, MarianMTModel

    config = model.config
    for site in SITES:
        for layer in range(config.encoder_layers if site == ENCODER_SELF_ATTENTION else config.decoder_layers):
            variant, _ = config.attention_variant(site, layer)
            if not get_attention_variant(variant).exportable:
                raise ValueError(f"to_marian: {site} of layer {layer} uses the {variant!r} attention variant; "
                                 "MarianMTModel computes softmax attention only")
    if config.pruned_heads:
        raise ValueError(f"to_marian: the model has pruned heads ({config.pruned_heads}); MarianMTModel keeps "
                         "every head")
    if config.position_embedding != "sinusoidal":
        raise ValueError(f"to_marian: position_embedding={config.position_embedding!r}; MarianMTModel has "
                         "sinusoidal positions only")
    marian_config = MarianConfig(
        vocab_size=config.vocab_size, decoder_vocab_size=config.decoder_vocab_size, d_model=config.d_model,
        encoder_layers=config.encoder_layers, decoder_layers=config.decoder_layers,
        encoder_attention_heads=config.encoder_attention_heads,
        decoder_attention_heads=config.decoder_attention_heads, encoder_ffn_dim=config.encoder_ffn_dim,
        decoder_ffn_dim=config.decoder_ffn_dim, activation_function=config.activation_function,
        dropout=config.dropout, attention_dropout=config.attention_dropout,
        activation_dropout=config.activation_dropout, encoder_layerdrop=config.encoder_layerdrop,
        decoder_layerdrop=config.decoder_layerdrop, max_position_embeddings=config.max_position_embeddings,
        scale_embedding=config.scale_embedding,
        share_encoder_decoder_embeddings=config.share_encoder_decoder_embeddings,
        tie_word_embeddings=config.tie_word_embeddings, init_std=config.init_std,
        pad_token_id=config.pad_token_id, eos_token_id=config.eos_token_id,
        decoder_start_token_id=config.decoder_start_token_id, forced_eos_token_id=None,
    )
    marian = MarianMTModel(marian_config)
    state = {_headattn_key_to_marian(key): value for key, value in model.state_dict().items()}
    missing, unexpected = marian.load_state_dict(state, strict=False)
    if unexpected:
        raise ValueError(f"to_marian: weights with no place in MarianMTModel: {unexpected[:5]}")
    really_missing = [key for key in missing if "embed_positions" not in key]  # Marian builds its own table
    if really_missing:
        raise ValueError(f"to_marian: MarianMTModel weights this model lacks: {really_missing[:5]}")
    marian.tie_weights()
    marian.generation_config = copy.deepcopy(model.generation_config)
    return marian.to(model.dtype).eval()


def _marian_key_to_headattn(key: str) -> str:
    """Marian and this model name weights alike, except that the feed-forward sits in its own module."""
    for name in ("fc1", "fc2"):
        key = key.replace(f".{name}.", f".ffn.{name}.")
    return key


def _headattn_key_to_marian(key: str) -> str:
    """The inverse of `_marian_key_to_headattn`."""
    for name in ("fc1", "fc2"):
        key = key.replace(f".ffn.{name}.", f".{name}.")
    return key
