"""Marian-style Transformer encoder-decoder whose attention at each site is a pluggable variant.

The arithmetic follows `transformers.models.marian.modeling_marian` (post-LN layers, Marian's sinusoidal
position table, optional sqrt(d_model) embedding scale, final logits bias); the attention in between the
q/k/v projections and the residual is delegated to the variant the config names for that site and layer.
"""

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import nn
from transformers.activations import ACT2FN
from transformers.cache_utils import Cache
from transformers.generation import GenerationMixin
from transformers.generation.utils import GenerateBeamEncoderDecoderOutput, GenerateEncoderDecoderOutput
from transformers.modeling_layers import GradientCheckpointingLayer
from transformers.modeling_outputs import (
    BaseModelOutput,
    BaseModelOutputWithPastAndCrossAttentions,
    Seq2SeqLMOutput,
    Seq2SeqModelOutput,
)
from transformers.modeling_utils import PreTrainedModel
from transformers.utils import logging

from .attention_base import (
    CROSS_ATTENTION,
    DECODER_SELF_ATTENTION,
    ENCODER_SELF_ATTENTION,
    AttentionMask,
    AttentionResult,
)
from .attention_backends import registered_implementations
from .attention_registry import get_attention_variant
from .cache_headattn import HeadAttnCache
from .configuration_headattn import HeadAttnConfig
from .fertility import SourceFertility
from .guided_alignment import guided_alignment_loss, scores_softmax, weighted_for_step
from .marian_conversion import convert_from_marian, convert_to_marian
from .pipeline_headattn import TranslationPipeline  # noqa: F401  (config.custom_pipelines names it; imported, it travels)
from .remote_code import check_code_travels
from .seq2seq_common import (
    check_generate_inputs,
    check_generation_counts,
    check_seq2seq_inputs,
    checks_inputs,
    inputs_checked_by_caller,
    NamesDamagedWeights,
    seq2seq_loss,
    shift_tokens_right,
)
from .transformers_compat import accepts_past_key_values, cache_of, drop_cache_position, init, with_cache
from .variant_checks import check_attention_implementation, refuse_candidate_decoding, unknown_attention_implementation
# Transformers before 5.10 copies into its modules cache only the modules that a remote-code entry (a module named
# in config.json's auto_map) imports directly, so entries also import the modules their imports need
# (tests/test_remote_code.py checks it).
from .attention_backends import softmax_attention  # noqa: F401
from .attention_dhicm import DynamicHeadImportanceAttention  # noqa: F401
from .attention_entmax import Entmax15Attention  # noqa: F401
from .attention_functions import register_attention_functions  # noqa: F401
from .attention_mma import MixedMultiHeadAttention  # noqa: F401
from .attention_multihop import MultiHopAttention  # noqa: F401
from .attention_running_sum import RunningSumAttention  # noqa: F401
from .attention_softmax import SoftmaxAttention  # noqa: F401
from .attention_sparse import SparsemaxAttention  # noqa: F401
from .rnn_packing import run_packed_lstm  # noqa: F401
from .sparse_attention import sparsemax  # noqa: F401
from .sparse_solvers import solve_sparsemax  # noqa: F401
# The Triton kernels import triton, which a saved model must load without: named here for the copy only (never run),
# they are imported where a kernel runs (`sparse_attention.kernel_backend`).
if TYPE_CHECKING:
    from .triton_kernels import constrained_scan  # noqa: F401


logger = logging.get_logger(__name__)

# ------------------------------------------------------------------------------------------------ outputs
@dataclass
class HeadAttnEncoderOutput(BaseModelOutput):
    """Encoder output plus what the encoder's attention variants add. The per-sentence tensors are batch-first
    so that `generate` expands them to beams with the rest of the encoder output.

    aux_loss: [batch, modules] each variant module's auxiliary loss averaged over the sentence's real tokens.
    head_kl: [batch, modules] the same for KL(head importances || uniform) of the modules that weigh heads.
    head_importances: module name -> [batch, source_len, heads], when `output_head_importances=True`.
    fertility: [batch, source_len] each source token's fertility, when a constrained cross-attention uses it.
    """

    aux_loss: torch.Tensor | None = None
    head_kl: torch.Tensor | None = None
    head_importances: dict[str, torch.Tensor] | None = None
    fertility: torch.Tensor | None = None


@dataclass
class HeadAttnDecoderOutput(BaseModelOutputWithPastAndCrossAttentions):
    """Decoder output; `aux_loss` and `head_kl` are per token, [batch, modules, target_len]; `guided_attention`
    [batch, guided heads, target_len, source_len] the guided heads' distributions (`guided_alignment.py`), when
    asked for."""

    aux_loss: torch.Tensor | None = None
    head_kl: torch.Tensor | None = None
    head_importances: dict[str, torch.Tensor] | None = None
    guided_attention: torch.Tensor | None = None


@dataclass
class HeadAttnSeq2SeqModelOutput(Seq2SeqModelOutput):
    """`Seq2SeqModelOutput` plus what the attention variants add, averaged over the real target tokens as the
    cross-entropy is (see `_average_over_target_tokens`) and over the modules that report them:

    aux_loss: the variants' auxiliary loss (for DHICM, -lambda * KL).
    head_kl: KL(head importances || uniform) of the modules that weigh heads (DHICM).
    head_importances: module name -> [batch, tokens, heads], when `output_head_importances=True`.
    guided_attention: [batch, guided heads, target_len, source_len], the distributions of the guided heads
        (`config.guided_alignment_layer` / `guided_alignment_heads`) that guided alignment compares with the links,
        when `output_guided_attention=True` (None when LayerDrop skipped that layer).
    """

    aux_loss: torch.Tensor | None = None
    head_kl: torch.Tensor | None = None
    head_importances: dict[str, torch.Tensor] | None = None
    guided_attention: torch.Tensor | None = None


@dataclass
class HeadAttnSeq2SeqLMOutput(Seq2SeqLMOutput):
    """`Seq2SeqLMOutput` whose `loss` is cross-entropy (with the config's label smoothing) plus `aux_loss` plus
    `config.guided_alignment_weight` times `alignment_loss`; `ce_loss` is the cross-entropy part alone;
    `alignment_loss` the guided-alignment cost per target token, before its weight, when `alignment_links` were given
    (`guided_alignment.py`); `head_kl`, `head_importances` and `guided_attention` (with `alignment_links`) as in
    `HeadAttnSeq2SeqModelOutput`."""

    ce_loss: torch.FloatTensor | None = None
    alignment_loss: torch.FloatTensor | None = None
    aux_loss: torch.Tensor | None = None
    head_kl: torch.Tensor | None = None
    head_importances: dict[str, torch.Tensor] | None = None
    guided_attention: torch.Tensor | None = None


@dataclass
class HeadAttnGenerateOutput(GenerateEncoderDecoderOutput):
    """`generate` output with `head_importances` (module name -> [sequences, tokens, heads]); for decoder
    modules, row t belongs to the step that produced `sequences[:, t + 1]`; rows after a sequence's end are
    padding."""

    head_importances: dict[str, torch.Tensor] | None = None


@dataclass
class HeadAttnGenerateBeamOutput(GenerateBeamEncoderDecoderOutput):
    """Beam-search `generate` output with `head_importances`, as in `HeadAttnGenerateOutput`."""

    head_importances: dict[str, torch.Tensor] | None = None


class _AttentionRecords:
    """Collects, during one encoder or decoder pass, what the attention modules report."""

    def __init__(self, output_attentions: bool):
        self.output_attentions = output_attentions
        self.weights: dict[str, list[torch.Tensor]] = {}
        self.aux_losses: list[torch.Tensor] = []
        self.head_kls: list[torch.Tensor] = []
        self.head_importances: dict[str, torch.Tensor] = {}

    def add(self, kind: str, module_name: str, result: AttentionResult) -> None:
        if self.output_attentions:
            self.weights.setdefault(kind, []).append(result.weights)
        if result.aux_loss is not None:
            self.aux_losses.append(result.aux_loss)
        if result.head_kl is not None:
            self.head_kls.append(result.head_kl)
        if result.head_importances is not None:
            self.head_importances[module_name] = result.head_importances

    def attentions(self, kind: str) -> tuple[torch.Tensor, ...] | None:
        return tuple(self.weights.get(kind, ())) if self.output_attentions else None


def _stack_terms(terms: list[torch.Tensor]) -> torch.Tensor | None:
    """Per-token terms of several modules, [batch, tokens] each -> [batch, modules, tokens] in float32."""
    return torch.stack(terms, dim=1).float() if terms else None


def _masked_sum(terms: torch.Tensor, token_mask: torch.Tensor | None) -> torch.Tensor:
    """[batch, modules, tokens] -> [batch, modules], summed over the tokens where `token_mask` is True."""
    if token_mask is None:
        return terms.sum(-1)
    return torch.where(token_mask.bool()[:, None, :], terms, 0.0).sum(-1)


def _per_sentence_mean(terms: torch.Tensor | None, token_mask: torch.Tensor | None) -> torch.Tensor | None:
    """[batch, modules, tokens] -> [batch, modules], averaged over each sentence's real tokens."""
    if terms is None:
        return None
    counts = terms.new_full(terms.shape[:1], terms.shape[-1]) if token_mask is None else token_mask.sum(-1)
    return _masked_sum(terms, token_mask) / counts.to(terms.dtype).clamp(min=1)[:, None]


def _average_over_target_tokens(
    encoder_means: torch.Tensor | None, decoder_terms: torch.Tensor | None, target_token_mask: torch.Tensor
) -> torch.Tensor | None:
    """A per-token quantity of every module, averaged over modules and over real target tokens.

    Decoder modules sum their term over the real target tokens; encoder modules contribute each sentence's
    mean over its real source tokens, weighted by the sentence's number of target tokens. Every module's
    total is thus a sum over target tokens, like the summed cross-entropy, so dividing by the tokens of a whole
    optimizer step (`num_items_in_batch`) makes gradient accumulation exact."""
    if encoder_means is None and decoder_terms is None:  # the common case: no variant reports this quantity
        return None
    target_counts = target_token_mask.sum(-1).float()
    per_module = []
    if encoder_means is not None:
        per_module.append((encoder_means * target_counts[:, None]).sum(0))
    if decoder_terms is not None:
        per_module.append(_masked_sum(decoder_terms, target_token_mask).sum(0))
    return torch.cat(per_module).mean() / target_counts.sum().clamp(min=1)


# ------------------------------------------------------------------------------------------------ modules
class HeadAttnSinusoidalPositionalEmbedding(nn.Module):
    """Marian's fixed position table: sines in the first half of each vector, cosines in the second."""

    def __init__(self, num_positions: int, embedding_dim: int):
        super().__init__()
        self.register_buffer("weight", self.create_weight(num_positions, embedding_dim), persistent=False)

    @staticmethod
    def create_weight(num_positions: int, embedding_dim: int) -> torch.Tensor:
        positions = torch.arange(num_positions, dtype=torch.float64)[:, None]
        rates = torch.pow(10000.0, 2 * (torch.arange(embedding_dim, dtype=torch.float64) // 2) / embedding_dim)
        angles = positions / rates
        half = (embedding_dim + 1) // 2
        table = torch.empty(num_positions, embedding_dim, dtype=torch.float64)
        table[:, :half] = torch.sin(angles[:, 0::2])
        table[:, half:] = torch.cos(angles[:, 1::2])
        return table.float()

    def forward(self, seq_len: int, past_len: int = 0) -> torch.Tensor:
        if past_len + seq_len > self.weight.shape[0]:
            raise ValueError(
                f"Sequence of length {past_len + seq_len} exceeds max_position_embeddings={self.weight.shape[0]}; "
                "truncate the input or build the model with a larger max_position_embeddings"
            )
        return self.weight[past_len : past_len + seq_len]


class HeadAttnAttention(nn.Module):
    """Multi-head attention whose core (scores -> weights -> per-head outputs) is the configured variant."""

    def __init__(self, config: HeadAttnConfig, site: str, layer_idx: int):
        super().__init__()
        self.site = site
        self.layer_idx = layer_idx
        self.is_cross_attention = site == CROSS_ATTENTION
        embed_dim = config.d_model
        self.head_dim = embed_dim // config.attention_heads(site)
        self.num_heads = len(config.kept_heads(site, layer_idx))
        inner_dim = self.num_heads * self.head_dim
        self.q_proj = nn.Linear(embed_dim, inner_dim)
        self.k_proj = nn.Linear(embed_dim, inner_dim)
        self.v_proj = nn.Linear(embed_dim, inner_dim)
        variant_name, options = config.attention_variant(site, layer_idx)
        variant_class = get_attention_variant(variant_name)
        self.variant = variant_class(config, site, layer_idx, self.num_heads, self.head_dim, **options)
        self.out_proj = None if variant_class.combines_heads else nn.Linear(inner_dim, embed_dim)
        self.state_key = f"{site}.{layer_idx}"

    @torch.no_grad()
    def keep_heads(self, positions: list[int]) -> None:
        """Physically remove every head but those at `positions` (indices among this module's current heads):
        the q/k/v projections lose those heads' output rows and the output projection their input columns."""
        rows = torch.cat([torch.arange(p * self.head_dim, (p + 1) * self.head_dim) for p in positions])
        rows = rows.to(self.q_proj.weight.device)
        for name in ("q_proj", "k_proj", "v_proj"):
            old = getattr(self, name)
            new = nn.Linear(old.in_features, len(rows), device=old.weight.device, dtype=old.weight.dtype)
            new.weight.copy_(old.weight[rows])
            new.bias.copy_(old.bias[rows])
            setattr(self, name, new)
        if self.out_proj is not None:
            old = self.out_proj
            new = nn.Linear(len(rows), old.out_features, device=old.weight.device, dtype=old.weight.dtype)
            new.weight.copy_(old.weight[:, rows])
            new.bias.copy_(old.bias)
            self.out_proj = new
        self.num_heads = self.variant.num_heads = len(positions)

    def _split_heads(self, states: torch.Tensor) -> torch.Tensor:
        return states.view(*states.shape[:-1], self.num_heads, self.head_dim).transpose(1, 2)

    def forward(
        self,
        hidden_states: torch.Tensor,
        attention_mask: AttentionMask,
        key_value_states: torch.Tensor | None = None,
        cache: HeadAttnCache | None = None,
        output_attentions: bool = False,
        output_head_importances: bool = False,
        guided_heads: list[int] | None = None,
    ) -> tuple[torch.Tensor, AttentionResult]:
        """guided_heads: positions among this module's heads whose distributions over the source tokens the result
        carries as `guided_attention` (cross-attention, without a cache: in a teacher-forced pass)."""
        query = self._split_heads(self.q_proj(hidden_states))
        if self.is_cross_attention:
            if cache is not None and cache.is_updated.get(self.layer_idx):
                cached = cache.cross_attention_cache.layers[self.layer_idx]
                key, value = cached.keys, cached.values
            else:
                key = self._split_heads(self.k_proj(key_value_states))
                value = self._split_heads(self.v_proj(key_value_states))
                key, value = self.variant.cross_keys_and_values(key, value)
                if cache is not None:
                    key, value = cache.cross_attention_cache.update(key, value, self.layer_idx)
                    cache.is_updated[self.layer_idx] = True
        else:
            key = self._split_heads(self.k_proj(hidden_states))
            value = self._split_heads(self.v_proj(hidden_states))
            if cache is not None:
                key, value = cache.self_attention_cache.update(key, value, self.layer_idx)

        keeps_state = self.variant.stateful and cache is not None
        result = self.variant(
            query,
            key,
            value,
            attention_mask,
            hidden_states=hidden_states,
            state=cache.get_variant_state(self.state_key) if keeps_state else None,
            # the guided heads' weights are needed unless the scores stand in for them (exact zeros)
            output_attentions=output_attentions or (guided_heads is not None and not self.variant.exact_zeros),
            output_head_importances=output_head_importances,
        )
        if guided_heads is not None:
            result.guided_attention = self._guided_attention(result, query, key, attention_mask, guided_heads,
                                                             num_sources=key_value_states.shape[1])
            if not output_attentions:
                result.weights = None
        if keeps_state:
            cache.set_variant_state(self.state_key, result.state)
        output = result.output
        if self.out_proj is not None:
            output = self.out_proj(output.reshape(*hidden_states.shape[:-1], -1))
        return output, result


    def _guided_attention(self, result, query, key, attention_mask, heads, num_sources) -> torch.Tensor:
        """[batch, len(heads), queries, sources]: the heads' weights over the source tokens, or for a variant whose
        weights have exact zeros the softmax of the heads' scores, over the source tokens only (not a <SINK>):
        a link outside a sparse support would get no gradient through the weights (guided_alignment.py)."""
        index = torch.tensor(heads, device=query.device)
        if not self.variant.exact_zeros:
            return result.weights.index_select(1, index)[..., :num_sources]
        scores = torch.matmul(query.index_select(1, index), key.index_select(1, index)[..., :num_sources, :].transpose(-1, -2))
        allowed = attention_mask.allowed[..., :num_sources] if attention_mask.allowed is not None else None
        return scores_softmax(scores * self.variant.scaling, allowed)


class HeadAttnFeedForward(nn.Module):
    def __init__(self, config: HeadAttnConfig, ffn_dim: int):
        super().__init__()
        self.fc1 = nn.Linear(config.d_model, ffn_dim)
        self.fc2 = nn.Linear(ffn_dim, config.d_model)
        self.activation_fn = ACT2FN[config.activation_function]
        self.activation_dropout = config.activation_dropout

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        hidden_states = self.activation_fn(self.fc1(hidden_states))
        hidden_states = nn.functional.dropout(hidden_states, p=self.activation_dropout, training=self.training)
        return self.fc2(hidden_states)


class HeadAttnEncoderLayer(GradientCheckpointingLayer):
    def __init__(self, config: HeadAttnConfig, layer_idx: int):
        super().__init__()
        self.dropout = config.dropout
        self.self_attn = HeadAttnAttention(config, ENCODER_SELF_ATTENTION, layer_idx)
        self.self_attn_layer_norm = nn.LayerNorm(config.d_model)
        self.ffn = HeadAttnFeedForward(config, config.encoder_ffn_dim)
        self.final_layer_norm = nn.LayerNorm(config.d_model)

    def forward(
        self,
        hidden_states: torch.Tensor,
        attention_mask: AttentionMask,
        output_attentions: bool = False,
        output_head_importances: bool = False,
    ) -> tuple[torch.Tensor, AttentionResult]:
        attended, result = self.self_attn(
            hidden_states,
            attention_mask,
            output_attentions=output_attentions,
            output_head_importances=output_head_importances,
        )
        hidden_states = self.self_attn_layer_norm(
            hidden_states + nn.functional.dropout(attended, p=self.dropout, training=self.training)
        )
        transformed = self.ffn(hidden_states)
        hidden_states = self.final_layer_norm(
            hidden_states + nn.functional.dropout(transformed, p=self.dropout, training=self.training)
        )
        return hidden_states, result


class HeadAttnDecoderLayer(GradientCheckpointingLayer):
    def __init__(self, config: HeadAttnConfig, layer_idx: int):
        super().__init__()
        self.dropout = config.dropout
        self.self_attn = HeadAttnAttention(config, DECODER_SELF_ATTENTION, layer_idx)
        self.self_attn_layer_norm = nn.LayerNorm(config.d_model)
        self.encoder_attn = HeadAttnAttention(config, CROSS_ATTENTION, layer_idx)
        self.encoder_attn_layer_norm = nn.LayerNorm(config.d_model)
        self.ffn = HeadAttnFeedForward(config, config.decoder_ffn_dim)
        self.final_layer_norm = nn.LayerNorm(config.d_model)

    @accepts_past_key_values
    def forward(
        self,
        hidden_states: torch.Tensor,
        self_attention_mask: AttentionMask,
        encoder_hidden_states: torch.Tensor,
        cross_attention_mask: AttentionMask,
        cache: HeadAttnCache | None = None,
        output_attentions: bool = False,
        output_head_importances: bool = False,
        guided_heads: list[int] | None = None,
    ) -> tuple[torch.Tensor, AttentionResult, AttentionResult]:
        flags = {"output_attentions": output_attentions, "output_head_importances": output_head_importances}
        attended, self_result = self.self_attn(
            hidden_states, self_attention_mask, cache=cache, **flags
        )
        hidden_states = self.self_attn_layer_norm(
            hidden_states + nn.functional.dropout(attended, p=self.dropout, training=self.training)
        )
        attended, cross_result = self.encoder_attn(
            hidden_states,
            cross_attention_mask,
            key_value_states=encoder_hidden_states,
            cache=cache,
            guided_heads=guided_heads,
            **flags,
        )
        hidden_states = self.encoder_attn_layer_norm(
            hidden_states + nn.functional.dropout(attended, p=self.dropout, training=self.training)
        )
        transformed = self.ffn(hidden_states)
        hidden_states = self.final_layer_norm(
            hidden_states + nn.functional.dropout(transformed, p=self.dropout, training=self.training)
        )
        return hidden_states, self_result, cross_result


# ------------------------------------------------------------------------------------------------ models
class HeadAttnPreTrainedModel(NamesDamagedWeights, PreTrainedModel):
    config_class = HeadAttnConfig
    config: HeadAttnConfig
    base_model_prefix = "model"
    supports_gradient_checkpointing = True
    # The softmax sites call Transformers' attention functions (attention_backends.softmax_attention), so every
    # implementation is accepted; check_attention_implementation refuses what a variant cannot run under.
    _supports_sdpa = True
    _supports_flex_attn = True
    _supports_flash_attn = True
    _no_split_modules = ["HeadAttnEncoderLayer", "HeadAttnDecoderLayer"]

    @classmethod
    def _can_set_attn_implementation(cls) -> bool:
        """Whether `set_attn_implementation` may change the implementation: yes. (Transformers guesses it from the
        modeling file's text, which its releases search for different call patterns; the call is in
        attention_backends.py.)"""
        return True

    def get_correct_attn_implementation(self, requested_attention: str | None, is_init_check: bool = False) -> str:
        """Transformers' check of a requested implementation, with an error for unknown names that lists every
        accepted one (Transformers' own lists only its built-in names)."""
        if requested_attention is not None and requested_attention not in registered_implementations():
            raise ValueError(unknown_attention_implementation(requested_attention))
        return super().get_correct_attn_implementation(requested_attention, is_init_check)

    def _check_and_adjust_attn_implementation(self, attn_implementation: str | None, is_init_check: bool = False,
                                              **kwargs) -> str:
        """Transformers' choice of the implementation (`from_pretrained`, `from_config`, the constructor and
        `set_attn_implementation` all pass here), then `check_attention_implementation` on the model's variants."""
        implementation = super()._check_and_adjust_attn_implementation(attn_implementation, is_init_check, **kwargs)
        check_attention_implementation(self.config, implementation)
        return implementation

    @torch.no_grad()
    def _init_weights(self, module):
        super()._init_weights(module)
        if isinstance(module, HeadAttnSinusoidalPositionalEmbedding):
            init.copy_(module.weight, module.create_weight(*module.weight.shape))
        elif isinstance(module, HeadAttnForConditionalGeneration):
            init.zeros_(module.final_logits_bias)

    def get_expanded_tied_weights_keys(self, all_submodels: bool = False) -> dict:
        """Transformers 5's tied pairs, and with `share_encoder_decoder_embeddings` the embeddings it shares also under
        tie_word_embeddings=False, where Transformers ties no pair at all: that flag unties only the output
        projection (`lm_head`) from them, as in Marian."""
        tied = super().get_expanded_tied_weights_keys(all_submodels=all_submodels)
        if all_submodels or not self.config.share_encoder_decoder_embeddings:
            return tied  # all_submodels: gathered from each submodel's answer to this method
        shared = {target: source for target, source in (getattr(self, "_tied_weights_keys", None) or {}).items()
                  if target != "lm_head.weight"}
        return {**shared, **tied}

    def _tie_weights(self) -> None:
        """Transformers 4.x ties only the output projection to the input embeddings and then calls this hook, so it
        ties every pair of `_tied_weights_keys` (5.x does that itself and never calls it)."""
        for target, source in (getattr(self, "_tied_weights_keys", None) or {}).items():
            if target == "lm_head.weight" and not self.config.tie_word_embeddings:
                continue
            module_name, _, parameter_name = target.rpartition(".")
            setattr(self.get_submodule(module_name), parameter_name, self.get_parameter(source))

    def save_pretrained(self, save_directory, *args, **kwargs):
        """Save weights, config and code, so that the folder loads through
        `AutoModelForSeq2SeqLM.from_pretrained(folder, trust_remote_code=True)` and
        `pipeline("translation", model=folder, trust_remote_code=True)` without this package installed.
        Transformers' `custom_object_save` copies this module and every module it imports (the pipeline among
        them, see the imports above); `check_code_travels` makes sure they are all there before anything is
        written."""
        check_code_travels(type(self))
        super().save_pretrained(save_directory, *args, **kwargs)

    def check_inputs(self, **arguments) -> None:
        """Raise ValueError for inputs that `forward` or `generate` cannot use (`check_seq2seq_inputs`, with this
        model's vocabularies and width); called before any work."""
        target_vocab_size = self.get_decoder().embed_tokens.num_embeddings
        output_embeddings = self.get_output_embeddings()
        check_seq2seq_inputs(
            source_vocab_size=self.get_encoder().embed_tokens.num_embeddings,
            target_vocab_size=target_vocab_size,
            label_vocab_size=output_embeddings.out_features if output_embeddings is not None else target_vocab_size,
            width=self.config.d_model,
            **arguments,
        )

    def prune_heads(self, heads_to_prune: dict[str, list[int]]) -> None:
        """Remove attention heads for good: `heads_to_prune` maps module names (`"encoder.layers.5.self_attn"`,
        `"decoder.layers.5.self_attn"`, `"decoder.layers.5.encoder_attn"`) to head indices among the site's
        original heads. The projections shrink, `config.pruned_heads` records the removal, and the pruned model
        saves and loads (also through remote code) like any other."""
        config = self.config
        if heads_to_prune is config.pruned_heads:
            return  # Transformers 4.x's init_weights re-applies the config's record, which construction already did
        proposed = {name: list(heads) for name, heads in config.pruned_heads.items()}
        for name, heads in heads_to_prune.items():
            already = sorted(set(heads) & set(proposed.get(name, ())))
            if already:
                raise ValueError(f"Head(s) {already} of {name!r} are already pruned")
            proposed[name] = sorted([*proposed.get(name, ()), *heads])
        modules = config.attention_modules()
        kept_before = {name: config.kept_heads(*modules[name]) for name in heads_to_prune if name in modules}
        previous = config.pruned_heads
        config.pruned_heads = proposed
        try:
            config.validate_architecture()
        except ValueError:
            config.pruned_heads = previous
            raise
        for name, heads in kept_before.items():
            kept_after = config.kept_heads(*modules[name])
            self.base_model.get_submodule(name).keep_heads([heads.index(head) for head in kept_after])


class HeadAttnStack(nn.Module):
    """What the encoder and decoder share: token embeddings, the position table, input dropout, LayerDrop."""

    def __init__(self, config: HeadAttnConfig, embed_tokens: nn.Embedding, layers: list[nn.Module], layerdrop: float):
        super().__init__()
        self.config = config
        self.dropout = config.dropout
        self.layerdrop = layerdrop
        self.embed_scale = math.sqrt(config.d_model) if config.scale_embedding else 1.0
        self.embed_tokens = embed_tokens
        self.embed_positions = (
            HeadAttnSinusoidalPositionalEmbedding(config.max_position_embeddings, config.d_model)
            if config.position_embedding == "sinusoidal"
            else None
        )
        self.layers = nn.ModuleList(layers)

    def get_input_embeddings(self) -> nn.Embedding:
        return self.embed_tokens

    def set_input_embeddings(self, value: nn.Embedding) -> None:
        self.embed_tokens = value

    def _add_positions(self, inputs_embeds: torch.Tensor, past_len: int = 0) -> torch.Tensor:
        hidden_states = inputs_embeds
        if self.embed_positions is not None:
            hidden_states = hidden_states + self.embed_positions(inputs_embeds.shape[1], past_len).to(inputs_embeds.dtype)
        return nn.functional.dropout(hidden_states, p=self.dropout, training=self.training)

    def _skips_layer(self) -> bool:
        return self.training and self.layerdrop > 0.0 and bool(torch.rand([]) < self.layerdrop)


class HeadAttnEncoder(HeadAttnStack):
    def __init__(self, config: HeadAttnConfig, embed_tokens: nn.Embedding):
        layers = [HeadAttnEncoderLayer(config, i) for i in range(config.encoder_layers)]
        super().__init__(config, embed_tokens, layers, config.encoder_layerdrop)
        # What the constrained cross-attention variants need to bound attention (Malaviya et al., Sec. 4)
        self.source_fertility = SourceFertility(config) if config.uses_fertility() else None

    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
        output_head_importances: bool = False,
        return_dict: bool | None = None,
    ) -> HeadAttnEncoderOutput:
        if (input_ids is None) == (inputs_embeds is None):
            raise ValueError("Pass exactly one of `input_ids` or `inputs_embeds` to the encoder")
        output_attentions = output_attentions if output_attentions is not None else self.config.output_attentions
        output_hidden_states = (
            output_hidden_states if output_hidden_states is not None else self.config.output_hidden_states
        )
        if inputs_embeds is None:  # as in Marian, embeddings passed in by the caller are not scaled
            inputs_embeds = self.embed_tokens(input_ids) * self.embed_scale
        hidden_states = self._add_positions(inputs_embeds)

        mask = AttentionMask(attention_mask.bool()[:, None, None, :] if attention_mask is not None else None,
                             padding=attention_mask)
        records = _AttentionRecords(output_attentions)
        all_hidden_states = [hidden_states] if output_hidden_states else None
        for idx, layer in enumerate(self.layers):
            if self._skips_layer():
                continue
            hidden_states, result = layer(hidden_states, mask, output_attentions, output_head_importances)
            records.add("self", f"encoder.layers.{idx}.self_attn", result)
            if output_hidden_states:
                all_hidden_states.append(hidden_states)

        output = HeadAttnEncoderOutput(
            last_hidden_state=hidden_states,
            hidden_states=tuple(all_hidden_states) if output_hidden_states else None,
            attentions=records.attentions("self"),
            aux_loss=_per_sentence_mean(_stack_terms(records.aux_losses), attention_mask),
            head_kl=_per_sentence_mean(_stack_terms(records.head_kls), attention_mask),
            head_importances=records.head_importances or None,
            fertility=(self.source_fertility(input_ids, attention_mask, inputs_embeds)
                       if self.source_fertility is not None else None),
        )
        return output.to_tuple() if return_dict is False else output


class HeadAttnDecoder(HeadAttnStack):
    def __init__(self, config: HeadAttnConfig, embed_tokens: nn.Embedding):
        layers = [HeadAttnDecoderLayer(config, i) for i in range(config.decoder_layers)]
        super().__init__(config, embed_tokens, layers, config.decoder_layerdrop)

    @staticmethod
    def _self_attention_mask(
        batch_size: int, seq_len: int, past_len: int, attention_mask: torch.Tensor | None, device
    ) -> AttentionMask:
        total = past_len + seq_len
        if attention_mask is None and seq_len == 1:
            return AttentionMask(None, causal=True)  # one new token sees every cached position
        query_positions = torch.arange(past_len, total, device=device)[:, None]
        allowed = (query_positions >= torch.arange(total, device=device)[None, :])[None, None]
        if attention_mask is not None:
            if attention_mask.shape != (batch_size, total):
                raise ValueError(
                    f"decoder_attention_mask has shape {tuple(attention_mask.shape)}; expected "
                    f"({batch_size}, {total}) = (batch, cached + new decoder positions)"
                )
            allowed = allowed & attention_mask.bool()[:, None, None, :]
        return AttentionMask(allowed, is_causal=attention_mask is None and past_len == 0, padding=attention_mask,
                             causal=True)

    @accepts_past_key_values
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        encoder_hidden_states: torch.Tensor | None = None,
        encoder_attention_mask: torch.Tensor | None = None,
        cache: Cache | None = None,
        inputs_embeds: torch.Tensor | None = None,
        use_cache: bool | None = None,
        output_attentions: bool = False,
        output_hidden_states: bool = False,
        output_head_importances: bool = False,
        encoder_fertility: torch.Tensor | None = None,
        output_guided_attention: bool = False,
    ) -> HeadAttnDecoderOutput:
        if (input_ids is None) == (inputs_embeds is None):
            raise ValueError("Pass exactly one of `decoder_input_ids` or `decoder_inputs_embeds`")
        if inputs_embeds is None:
            inputs_embeds = self.embed_tokens(input_ids)
        inputs_embeds = inputs_embeds * self.embed_scale
        batch_size, seq_len = inputs_embeds.shape[:2]

        if use_cache:
            cache = HeadAttnCache() if cache is None else HeadAttnCache.wrap(cache)
        else:
            cache = None
        past_len = cache.get_seq_length() if cache is not None else 0
        if torch.is_tensor(past_len):
            raise NotImplementedError(
                "The decoder needs a cache that grows with the decoded positions (DynamicCache, the default): a static "
                "cache (cache_implementation='static', or the StaticCache of transformers.integrations.executorch's "
                "Seq2SeqLMExportableModule) holds unfilled slots and reports its length as a tensor, which the "
                "decoder's positions and masks do not handle. torch.export and export_for_generation work with the "
                "default cache."
            )

        hidden_states = self._add_positions(inputs_embeds, past_len)

        self_mask = self._self_attention_mask(batch_size, seq_len, past_len, attention_mask, inputs_embeds.device)
        cross_mask = AttentionMask(
            encoder_attention_mask.bool()[:, None, None, :] if encoder_attention_mask is not None else None,
            fertility=encoder_fertility,
            padding=encoder_attention_mask,
        )
        records = _AttentionRecords(output_attentions)
        guided_layer, guided_heads = self.guided_heads() if output_guided_attention else (None, None)
        guided_attention = None
        all_hidden_states = [hidden_states] if output_hidden_states else None
        for idx, layer in enumerate(self.layers):
            if self._skips_layer():
                continue
            hidden_states, self_result, cross_result = layer(
                hidden_states,
                self_mask,
                encoder_hidden_states,
                cross_mask,
                # under the release's name, which GradientCheckpointingLayer drops when it checkpoints in training
                **with_cache(cache),
                output_attentions=output_attentions,
                output_head_importances=output_head_importances,
                guided_heads=guided_heads if idx == guided_layer else None,
            )
            if idx == guided_layer:
                guided_attention = cross_result.guided_attention
            records.add("self", f"decoder.layers.{idx}.self_attn", self_result)
            records.add("cross", f"decoder.layers.{idx}.encoder_attn", cross_result)
            if output_hidden_states:
                all_hidden_states.append(hidden_states)

        return HeadAttnDecoderOutput(
            last_hidden_state=hidden_states,
            **with_cache(cache),
            hidden_states=tuple(all_hidden_states) if output_hidden_states else None,
            attentions=records.attentions("self"),
            cross_attentions=records.attentions("cross"),
            aux_loss=_stack_terms(records.aux_losses),
            head_kl=_stack_terms(records.head_kls),
            head_importances=records.head_importances or None,
            guided_attention=guided_attention,
        )

    def guided_heads(self) -> tuple[int, list[int]]:
        """The guided cross-attention's layer index in [0, decoder_layers) and the guided heads' positions among
        that module's heads (`config.guided_alignment_heads` are original indices; pruning renumbers)."""
        layer = self.config.guided_alignment_layer_index()
        kept = self.config.kept_heads(CROSS_ATTENTION, layer)
        return layer, [kept.index(head) for head in self.config.guided_alignment_heads]


class HeadAttnModel(HeadAttnPreTrainedModel):
    """The bare encoder-decoder (no language-model head)."""

    def __init__(self, config: HeadAttnConfig):
        super().__init__(config)
        if config.share_encoder_decoder_embeddings:
            self.shared = nn.Embedding(config.vocab_size, config.d_model, config.pad_token_id)
        if not config.share_encoder_decoder_embeddings:
            encoder_embeddings = nn.Embedding(config.vocab_size, config.d_model, config.pad_token_id)
            decoder_embeddings = nn.Embedding(config.decoder_vocab_size, config.d_model, config.pad_token_id)
        else:
            # Tied by parameter (`_tied_weights_keys`, whatever tie_word_embeddings says: see
            # `get_expanded_tied_weights_keys`), as in Marian, not by using one module three times: with one module,
            # loading marks the shared weight initialised through its tied names, and a checkpoint without it would
            # load with missing_keys=[] and the weight left on the meta device (Transformers 5.0 re-initialises it).
            self._tied_weights_keys = {
                "encoder.embed_tokens.weight": "shared.weight",
                "decoder.embed_tokens.weight": "shared.weight",
            }
            encoder_embeddings = nn.Embedding(config.vocab_size, config.d_model, config.pad_token_id)
            decoder_embeddings = nn.Embedding(config.vocab_size, config.d_model, config.pad_token_id)
        self.encoder = HeadAttnEncoder(config, encoder_embeddings)
        self.decoder = HeadAttnDecoder(config, decoder_embeddings)
        self.post_init()

    def get_input_embeddings(self) -> nn.Embedding:
        return self.encoder.embed_tokens

    def set_input_embeddings(self, value: nn.Embedding) -> None:
        if self.config.share_encoder_decoder_embeddings:
            self.shared = value
            self.decoder.embed_tokens = value
        self.encoder.embed_tokens = value

    def get_encoder(self, modality: str | None = None):
        """The text encoder; for another modality, what `PreTrainedModel.get_encoder` answers (this model itself:
        it has no such encoder), so that exporters do not take the model for a multimodal one."""
        return self.encoder if modality is None else super().get_encoder(modality=modality)

    def get_decoder(self):
        return self.decoder

    @accepts_past_key_values
    @checks_inputs
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        decoder_input_ids: torch.LongTensor | None = None,
        decoder_attention_mask: torch.Tensor | None = None,
        encoder_outputs: tuple | BaseModelOutput | None = None,
        cache: Cache | None = None,
        inputs_embeds: torch.Tensor | None = None,
        decoder_inputs_embeds: torch.Tensor | None = None,
        use_cache: bool | None = None,
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
        output_head_importances: bool = False,
        target_token_mask: torch.Tensor | None = None,
        output_guided_attention: bool = False,
        return_dict: bool | None = None,
    ) -> HeadAttnSeq2SeqModelOutput:
        r"""
        output_head_importances (`bool`): return each head-weighing module's per-token head importances.
        output_guided_attention (`bool`): return the guided heads' distributions over the source tokens
            (`outputs.guided_attention`, see `guided_alignment.py`); a teacher-forced pass, without a cache.
        target_token_mask (`torch.Tensor` of shape `(batch, target_length)`, *optional*): the decoder positions
            that are real tokens, over which the variants' auxiliary terms are averaged (default:
            `decoder_attention_mask`, else every position). `HeadAttnForConditionalGeneration` passes
            `labels != -100`.
        """
        output_attentions = output_attentions if output_attentions is not None else self.config.output_attentions
        output_hidden_states = (
            output_hidden_states if output_hidden_states is not None else self.config.output_hidden_states
        )
        use_cache = use_cache if use_cache is not None else self.config.use_cache
        if encoder_outputs is None:
            encoder_outputs = self.encoder(
                input_ids=input_ids,
                attention_mask=attention_mask,
                inputs_embeds=inputs_embeds,
                output_attentions=output_attentions,
                output_hidden_states=output_hidden_states,
                output_head_importances=output_head_importances,
            )
        elif not isinstance(encoder_outputs, BaseModelOutput):
            encoder_outputs = HeadAttnEncoderOutput(
                last_hidden_state=encoder_outputs[0],
                hidden_states=encoder_outputs[1] if len(encoder_outputs) > 1 else None,
                attentions=encoder_outputs[2] if len(encoder_outputs) > 2 else None,
            )
        decoder_outputs = self.decoder(
            input_ids=decoder_input_ids,
            attention_mask=decoder_attention_mask,
            encoder_hidden_states=encoder_outputs.last_hidden_state,
            encoder_attention_mask=attention_mask,
            cache=cache,
            inputs_embeds=decoder_inputs_embeds,
            use_cache=use_cache,
            output_attentions=output_attentions,
            output_hidden_states=output_hidden_states,
            output_head_importances=output_head_importances,
            encoder_fertility=getattr(encoder_outputs, "fertility", None),
            output_guided_attention=output_guided_attention,
        )
        if target_token_mask is None:
            target_token_mask = decoder_attention_mask
        if target_token_mask is None:
            target_token_mask = torch.ones(
                decoder_outputs.last_hidden_state.shape[:2], dtype=torch.bool, device=decoder_outputs.last_hidden_state.device
            )
        head_importances = {**(getattr(encoder_outputs, "head_importances", None) or {}),
                            **(decoder_outputs.head_importances or {})}
        output = HeadAttnSeq2SeqModelOutput(
            last_hidden_state=decoder_outputs.last_hidden_state,
            **with_cache(cache_of(decoder_outputs)),
            decoder_hidden_states=decoder_outputs.hidden_states,
            decoder_attentions=decoder_outputs.attentions,
            cross_attentions=decoder_outputs.cross_attentions,
            encoder_last_hidden_state=encoder_outputs.last_hidden_state,
            encoder_hidden_states=encoder_outputs.hidden_states,
            encoder_attentions=encoder_outputs.attentions,
            aux_loss=_average_over_target_tokens(
                getattr(encoder_outputs, "aux_loss", None), decoder_outputs.aux_loss, target_token_mask
            ),
            head_kl=_average_over_target_tokens(
                getattr(encoder_outputs, "head_kl", None), decoder_outputs.head_kl, target_token_mask
            ),
            head_importances=head_importances or None,
            guided_attention=decoder_outputs.guided_attention,
        )
        return output.to_tuple() if return_dict is False else output


class HeadAttnForConditionalGeneration(HeadAttnPreTrainedModel, GenerationMixin):
    """Encoder-decoder with a language-model head; the model's loss is label-smoothed cross-entropy plus the
    attention variants' auxiliary loss, normalised so that gradient accumulation gives the same result."""

    _keys_to_ignore_on_load_missing = ["final_logits_bias"]
    # `output_logits` takes final_logits_bias = None (the bias folded into lm_head's own, as int8 quantization does)
    final_logits_bias_optional = True
    # Trainer passes num_items_in_batch to forward when a model declares it takes loss kwargs.
    accepts_loss_kwargs = True

    def __init__(self, config: HeadAttnConfig):
        super().__init__(config)
        self.model = HeadAttnModel(config)
        target_vocab_size = config.vocab_size if config.share_encoder_decoder_embeddings else config.decoder_vocab_size
        self.register_buffer("final_logits_bias", torch.zeros(1, target_vocab_size))
        self.lm_head = nn.Linear(config.d_model, target_vocab_size, bias=False)
        if config.share_encoder_decoder_embeddings:
            self._tied_weights_keys = {
                "lm_head.weight": "model.shared.weight",
                "model.encoder.embed_tokens.weight": "model.shared.weight",
                "model.decoder.embed_tokens.weight": "model.shared.weight",
            }
        else:
            self._tied_weights_keys = {"lm_head.weight": "model.decoder.embed_tokens.weight"}
        self.post_init()

    def get_encoder(self, modality: str | None = None):
        """The text encoder; for another modality, `PreTrainedModel.get_encoder`'s answer (this model itself)."""
        return self.model.encoder if modality is None else super().get_encoder(modality=modality)

    def get_decoder(self):
        return self.model.decoder

    def get_output_embeddings(self) -> nn.Linear:
        return self.lm_head

    def set_output_embeddings(self, new_embeddings: nn.Linear) -> None:
        self.lm_head = new_embeddings

    def resize_token_embeddings(self, new_num_tokens=None, pad_to_multiple_of=None, mean_resizing=True):
        if not self.config.share_encoder_decoder_embeddings:
            raise ValueError(
                "resize_token_embeddings resizes the shared vocabulary; this model has separate source and target "
                "embeddings (share_encoder_decoder_embeddings=False)"
            )
        embeddings = super().resize_token_embeddings(new_num_tokens, pad_to_multiple_of, mean_resizing)
        new_size = embeddings.weight.shape[0]
        self.config.decoder_vocab_size = new_size
        old_bias = self.final_logits_bias
        if new_size <= old_bias.shape[-1]:
            new_bias = old_bias[:, :new_size]
        else:
            new_bias = torch.cat([old_bias, old_bias.new_zeros(1, new_size - old_bias.shape[-1])], dim=1)
        self.register_buffer("final_logits_bias", new_bias.contiguous())
        return embeddings

    def output_logits(self, hidden_states: torch.Tensor) -> torch.Tensor:
        """lm_head(hidden_states) + final_logits_bias, with the bias added inside the output GEMM (addmm) rather
        than by a separate pass over the [batch, length, vocab] logits."""
        if self.final_logits_bias is None:  # folded into lm_head's own bias (hf_headattn's int8 `quantize` does)
            return self.lm_head(hidden_states)
        bias = self.final_logits_bias.view(-1).to(hidden_states.dtype)
        if not isinstance(self.lm_head, nn.Linear):  # e.g. replaced by a quantized linear, whose weight is a method
            return self.lm_head(hidden_states) + bias
        if self.lm_head.bias is not None:
            bias = bias + self.lm_head.bias
        return nn.functional.linear(hidden_states, self.lm_head.weight, bias)

    @accepts_past_key_values
    @checks_inputs
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        decoder_input_ids: torch.LongTensor | None = None,
        decoder_attention_mask: torch.Tensor | None = None,
        encoder_outputs: tuple | BaseModelOutput | None = None,
        cache: Cache | None = None,
        inputs_embeds: torch.Tensor | None = None,
        decoder_inputs_embeds: torch.Tensor | None = None,
        labels: torch.LongTensor | None = None,
        use_cache: bool | None = None,
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
        output_head_importances: bool = False,
        return_dict: bool | None = None,
        num_items_in_batch: int | torch.Tensor | None = None,
        alignment_links: torch.Tensor | None = None,
    ) -> HeadAttnSeq2SeqLMOutput:
        r"""
        labels (`torch.LongTensor` of shape `(batch, target_length)`, *optional*): target ids, -100 where
            ignored. Decoder inputs are derived from them when not given.
        alignment_links (`torch.Tensor` of shape `(batch, target_length, source_length)`, *optional*): for each
            label position a distribution over the source tokens it is linked to, zeros where it has no link
            (`hf_headattn.training.data` builds it from word alignments). With `labels`, the guided heads' cost
            against it is `outputs.alignment_loss`, and `config.guided_alignment_weight` times it is added to the
            loss (`guided_alignment.py`).
        output_head_importances (`bool`): return, for each DHICM module, the per-token head importances
            [batch, tokens, heads] in `outputs.head_importances`.
        num_items_in_batch (`int`, *optional*): number of label tokens across all micro-batches of one
            optimizer step (passed by `Trainer`); the loss is then a sum over this batch divided by it, so
            gradient accumulation matches a single large batch.
        """
        if labels is not None:
            use_cache = False
            if decoder_input_ids is None and decoder_inputs_embeds is None:
                decoder_input_ids = shift_tokens_right(
                    labels, self.config.pad_token_id, self.config.decoder_start_token_id
                )
        outputs = self.model(
            input_ids,
            attention_mask=attention_mask,
            decoder_input_ids=decoder_input_ids,
            decoder_attention_mask=decoder_attention_mask,
            encoder_outputs=encoder_outputs,
            cache=cache,
            inputs_embeds=inputs_embeds,
            decoder_inputs_embeds=decoder_inputs_embeds,
            use_cache=use_cache,
            output_attentions=output_attentions,
            output_hidden_states=output_hidden_states,
            output_head_importances=output_head_importances,
            target_token_mask=labels.ne(-100) if labels is not None else None,
            output_guided_attention=alignment_links is not None,
        )
        logits = self.output_logits(outputs.last_hidden_state)

        loss = ce_loss = alignment_loss = None
        if alignment_links is not None and labels is None:
            raise ValueError("`alignment_links` come with the `labels` they align: pass both (the cost is normalised "
                             "like the cross-entropy of the labels)")
        if labels is not None:
            ce_loss, loss = seq2seq_loss(logits, labels, self.config.label_smoothing, outputs.aux_loss,
                                         num_items_in_batch)
        if alignment_links is not None:
            if outputs.guided_attention is None:  # LayerDrop skipped the guided layer
                alignment_loss = loss.new_zeros(())
            else:
                alignment_loss = guided_alignment_loss(outputs.guided_attention, alignment_links,
                                                       self.config.guided_alignment_cost, labels)
                loss = loss + weighted_for_step(alignment_loss, self.config.guided_alignment_weight, labels,
                                                num_items_in_batch)
        elif self.training and torch.is_grad_enabled() and outputs.aux_loss is not None:  # not in generate
            logger.warning_once(
                "Training without `labels`: the attention variants' auxiliary loss is in `outputs.aux_loss` but no "
                "`outputs.loss` includes it. If Trainer's `label_smoothing_factor` took the labels, set the model's "
                "`config.label_smoothing` instead so that the model computes the whole loss."
            )

        output = HeadAttnSeq2SeqLMOutput(
            loss=loss,
            ce_loss=ce_loss,
            alignment_loss=alignment_loss,
            aux_loss=outputs.aux_loss,
            logits=logits,
            **with_cache(cache_of(outputs)),
            decoder_hidden_states=outputs.decoder_hidden_states,
            decoder_attentions=outputs.decoder_attentions,
            cross_attentions=outputs.cross_attentions,
            encoder_last_hidden_state=outputs.encoder_last_hidden_state,
            encoder_hidden_states=outputs.encoder_hidden_states,
            encoder_attentions=outputs.encoder_attentions,
            head_kl=outputs.head_kl,
            head_importances=outputs.head_importances,
            guided_attention=outputs.guided_attention,
        )
        return output.to_tuple() if return_dict is False else output

    def prepare_inputs_for_generation(self, *args, **kwargs):
        return drop_cache_position(super().prepare_inputs_for_generation(*args, **kwargs))

    def generate(self, inputs=None, *args, output_head_importances: bool = False, **kwargs):
        """`GenerationMixin.generate`; with `output_head_importances=True` it returns a
        `HeadAttnGenerateOutput` / `HeadAttnGenerateBeamOutput` whose `head_importances` hold, for each DHICM
        module, the importances of the final sequences. They come from one teacher-forced pass over the
        generated sequences, which computes exactly what the decoding steps computed (every step depends only
        on the source and the prefix), without carrying per-step tensors through beam reordering."""
        check_generate_inputs(self, inputs, kwargs)
        check_generation_counts(self.generation_config, kwargs)
        refuse_candidate_decoding(self, kwargs)
        if not output_head_importances:
            with inputs_checked_by_caller():  # the decoding steps' inputs come from generate itself
                return super().generate(inputs, *args, **kwargs)
        source_ids = inputs if inputs is not None else kwargs.get("input_ids")
        if source_ids is None:
            raise ValueError("generate(output_head_importances=True) needs the source token ids (`input_ids`)")
        kwargs["return_dict_in_generate"] = True
        with inputs_checked_by_caller():
            generated = super().generate(inputs, *args, **kwargs)
        sequences = generated.sequences
        per_source = sequences.shape[0] // source_ids.shape[0]
        attention_mask = kwargs.get("attention_mask")
        with torch.no_grad():
            teacher_forced = self(
                input_ids=source_ids.repeat_interleave(per_source, dim=0),
                attention_mask=attention_mask.repeat_interleave(per_source, dim=0) if attention_mask is not None else None,
                decoder_input_ids=sequences[:, :-1],
                output_head_importances=True,
                use_cache=False,
            )
        output_class = (
            HeadAttnGenerateBeamOutput if isinstance(generated, GenerateBeamEncoderDecoderOutput) else HeadAttnGenerateOutput
        )
        return output_class(**generated, head_importances=teacher_forced.head_importances)

    def prepare_decoder_input_ids_from_labels(self, labels: torch.Tensor) -> torch.Tensor:
        return shift_tokens_right(labels, self.config.pad_token_id, self.config.decoder_start_token_id)

    @classmethod
    def from_marian(cls, model_or_path, **config_overrides) -> "HeadAttnForConditionalGeneration":
        """Build an equivalent softmax model from a `MarianMTModel` (an instance, a local folder or a Hub id):
        same config, same weights, same generation config. `config_overrides` (e.g. an attention spec) are
        applied on top; parameters a variant adds keep their fresh initialisation (`marian_conversion`)."""
        return convert_from_marian(cls, model_or_path, **config_overrides)

    def to_marian(self):
        """The inverse of `from_marian`: this model as a `MarianMTModel` with the same config, weights and generation
        config, so the same logits (e.g. for CTranslate2's or Optimum's Marian converters; `marian_conversion`).

        Raises:
            ValueError: a model Marian cannot express, naming what: an attention variant other than softmax (with
                its site and layer), pruned heads, or positions other than Marian's sinusoidal table.
        """
        return convert_to_marian(self)


# save_pretrained copies each class's module and its relative imports, and names it in config.json's auto_map
HeadAttnModel.register_for_auto_class("AutoModel")
HeadAttnForConditionalGeneration.register_for_auto_class("AutoModelForSeq2SeqLM")


__all__ = [
    "HeadAttnEncoderOutput",
    "HeadAttnForConditionalGeneration",
    "HeadAttnGenerateBeamOutput",
    "HeadAttnGenerateOutput",
    "HeadAttnModel",
    "HeadAttnPreTrainedModel",
    "HeadAttnSeq2SeqLMOutput",
    "HeadAttnSeq2SeqModelOutput",
]
