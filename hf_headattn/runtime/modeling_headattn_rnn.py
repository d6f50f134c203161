"""Attentional LSTM encoder-decoder (Luong et al., 2015, with input feeding), the architecture of the multi-hop
attention paper (Iida et al., 2019) and of the sparse and constrained attention paper (Malaviya et al., 2018).

Encoder: embeddings, a bidirectional LSTM whose directions have d / 2 units, so that its states h_j have size d.
Decoder step t: the LSTM reads [embed(y_{t-1}); o_{t-1}] (input feeding) and gives d_t; N heads attend to the
source (Eq. 1-2 of Iida et al.: s^(k) = W_a^(k) d_t, scores s^(k)^T h_j), with the weights from softmax,
sparsemax, csoftmax or csparsemax (Malaviya et al., Eq. 3-6, the latter two bounded by fertility); K - 1
second-level hops re-weigh the heads' contexts (Eq. 7-9 or 19); o_t = tanh(W_o [d_t; c'^(1); ...; c'^(N)])
(Eq. 16) predicts y_t. All per-step state (LSTM states, input feed, cumulative attention) lives in
`HeadAttnRNNCache`, so that beam search reorders it.
"""

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import nn
from transformers.generation import GenerationMixin
from transformers.generation.utils import GenerateBeamEncoderDecoderOutput
from transformers.modeling_outputs import (
    BaseModelOutput,
    BaseModelOutputWithPastAndCrossAttentions,
    Seq2SeqLMOutput,
    Seq2SeqModelOutput,
)
from transformers.modeling_utils import PreTrainedModel
from transformers.utils import ModelOutput

from .attention_multihop import HeadHops
from .attention_sparse import constrained_attention_step, with_sink_column
from .cache_headattn import HeadAttnRNNCache
from .configuration_headattn_rnn import HeadAttnRNNConfig
from .fertility import SourceFertility
from .guided_alignment import guided_alignment_loss, scores_softmax, weighted_for_step
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
from .remote_code import check_code_travels
from .transformers_compat import accepts_past_key_values, cache_of, drop_cache_position, init, with_cache
from .rnn_packing import run_packed_lstm, run_packed_lstm_layers
from .sparse_attention import csoftmax, csparsemax, sparsemax
# Transformers before 5.10 copies into its modules cache only the modules that a remote-code entry (a module named
# in config.json's auto_map) imports directly, so entries also import the modules their imports need
# (tests/test_remote_code.py checks it).
from .attention_base import unrolled_length
from .attention_backends import softmax_attention  # noqa: F401
from .attention_dhicm import DynamicHeadImportanceAttention  # noqa: F401
from .attention_entmax import Entmax15Attention  # noqa: F401
from .attention_functions import register_attention_functions  # noqa: F401
from .attention_mma import MixedMultiHeadAttention  # noqa: F401
from .attention_registry import ATTENTION_VARIANTS  # noqa: F401
from .attention_running_sum import RunningSumAttention  # noqa: F401
from .attention_softmax import SoftmaxAttention  # noqa: F401
from .configuration_headattn import HeadAttnConfig  # noqa: F401
from .pipeline_headattn import TranslationPipeline  # noqa: F401
from .sparse_solvers import solve_sparsemax  # noqa: F401
# The Triton kernels import triton, which a saved model must load without: named here for the copy only (never run),
# they are imported where a kernel runs (`sparse_attention.kernel_backend`).
if TYPE_CHECKING:
    from .triton_kernels import constrained_scan  # noqa: F401


CONSTRAINED = {"csoftmax": csoftmax, "csparsemax": csparsemax}


def coverage_penalty(
    cumulative_attention: torch.Tensor, source_mask: torch.Tensor | None, beta: float, epsilon: float = 0.1
) -> torch.Tensor:
    """Wu et al.'s coverage penalty with Malaviya et al.'s epsilon (their footnote 5):
    cp = beta * sum_j log max(epsilon, min(1, sum_t alpha_tj)), over the real source tokens j.

    cumulative_attention: [batch, source_len], sum_t alpha_tj; source_mask: [batch, source_len] (1 = real)."""
    terms = torch.log(cumulative_attention.clamp(max=1.0).clamp(min=epsilon))
    if source_mask is not None:
        terms = terms * source_mask.to(terms.dtype)
    return beta * terms.sum(-1)


# ------------------------------------------------------------------------------------------------ outputs
@dataclass
class HeadAttnRNNEncoderOutput(BaseModelOutput):
    """Encoder states [batch, source_len, d] plus what the decoder starts from, batch-first so that `generate`
    expands it to beams: the final hidden and cell states of every encoder layer ([batch, layers, d], both
    directions concatenated), for constrained attention each source token's fertility [batch, source_len], and with
    `sink="token"` the <SINK> token's encoder state [batch, d] (the token is read after each sentence's last token;
    `last_hidden_state` holds the real tokens' states only)."""

    final_hidden: torch.Tensor | None = None
    final_cell: torch.Tensor | None = None
    fertility: torch.Tensor | None = None
    sink_states: torch.Tensor | None = None


@dataclass
class HeadAttnRNNDecoderOutput(BaseModelOutputWithPastAndCrossAttentions):
    """`last_hidden_state`: the attentional outputs o_t [batch, target_len, d]; `cross_attentions`: one
    [batch, heads, target_len, source_len] tensor (real source tokens only; any rest went to the sink);
    `head_importances`: the last dependent hop's weights over heads [batch, target_len, heads];
    `guided_attention`: the guided heads' distributions [batch, guided heads, target_len, source_len], when asked for
    (guided_alignment.py)."""

    head_importances: torch.Tensor | None = None
    guided_attention: torch.Tensor | None = None


@dataclass
class HeadAttnRNNSeq2SeqModelOutput(Seq2SeqModelOutput):
    """`Seq2SeqModelOutput` plus the dependent hops' weights over heads [batch, target_len, heads] and, with
    `output_guided_attention=True`, the guided heads' distributions (`HeadAttnRNNDecoderOutput`)."""

    head_importances: torch.Tensor | None = None
    guided_attention: torch.Tensor | None = None


@dataclass
class HeadAttnRNNSeq2SeqLMOutput(Seq2SeqLMOutput):
    """`Seq2SeqLMOutput` plus the dependent hops' weights over heads [batch, target_len, heads]; `loss` is the
    cross-entropy plus `config.guided_alignment_weight` times `alignment_loss`, the guided-alignment cost per target
    token (when `alignment_links` were given; guided_alignment.py), `ce_loss` the cross-entropy alone and
    `guided_attention` the guided heads' distributions the cost compared with the links."""

    head_importances: torch.Tensor | None = None
    ce_loss: torch.FloatTensor | None = None
    alignment_loss: torch.FloatTensor | None = None
    guided_attention: torch.Tensor | None = None


@dataclass
class HeadAttnRNNGenerateOutput(ModelOutput):
    """`generate(..., coverage_penalty=beta, return_dict_in_generate=True)`: the beam hypotheses re-ranked by
    `sequences_scores` (beam score + coverage penalty), best first for every source sentence, and the
    `coverage_penalties` that were added."""

    sequences: torch.LongTensor | None = None
    sequences_scores: torch.Tensor | None = None
    coverage_penalties: torch.Tensor | None = None


# ------------------------------------------------------------------------------------------------ modules
class HeadAttnRNNEncoder(nn.Module):
    def __init__(self, config: HeadAttnRNNConfig):
        super().__init__()
        self.config = config
        self.embed_tokens = nn.Embedding(config.vocab_size, config.embedding_size, config.pad_token_id)
        self.dropout = nn.Dropout(config.dropout)
        self.lstm = nn.LSTM(
            config.embedding_size,
            config.hidden_size // 2,
            num_layers=config.encoder_layers,
            dropout=config.dropout if config.encoder_layers > 1 else 0.0,
            bidirectional=True,
            batch_first=True,
        )
        # What the constrained transforms need to bound attention (Malaviya et al., Sec. 4)
        self.source_fertility = SourceFertility(config) if config.uses_fertility() else None
        # The <SINK> token's embedding: the token is appended to every source sentence and read by the encoder
        with_token = config.source_sink() == "token"
        self.sink_embedding = nn.Parameter(torch.zeros(config.embedding_size)) if with_token else None

    def forward(
        self,
        input_ids: torch.LongTensor,
        attention_mask: torch.Tensor | None = None,
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
        return_dict: bool | None = None,
    ) -> HeadAttnRNNEncoderOutput:
        if input_ids is None:
            raise ValueError("The LSTM encoder needs `input_ids`")
        mask = attention_mask.bool() if attention_mask is not None else torch.ones_like(input_ids, dtype=torch.bool)
        embeddings = self.embed_tokens(input_ids.masked_fill(~mask, self.config.pad_token_id))
        embeddings = self.dropout(embeddings) if self.config.embedding_dropout else embeddings
        lstm_inputs, lstm_mask = embeddings, mask
        if self.sink_embedding is not None:
            lstm_inputs, lstm_mask, sink_positions = self._append_sink(embeddings, mask)
        if output_hidden_states:  # one layer at a time, so that each layer's states are the tensors the next reads
            layer_states, (final_hidden, final_cell) = run_packed_lstm_layers(self.lstm, lstm_inputs, lstm_mask)
            states = layer_states[-1]
        else:
            states, (final_hidden, final_cell) = run_packed_lstm(self.lstm, lstm_inputs, lstm_mask)
        sink_states = None
        if self.sink_embedding is not None:
            sink_states = states[torch.arange(states.shape[0], device=states.device), sink_positions]
            # the real tokens' states only: what the attention reads as the source (zeros at padding, as without a
            # sink; the sink sits at a padding position of every sentence shorter than the batch's longest)
            states = self._without_sink(states, mask)
            if output_hidden_states:
                layer_states = [self._without_sink(layer, mask) for layer in layer_states]

        def per_layer(final):  # [layers * 2, batch, d / 2] -> [batch, layers, d], forward then backward
            layers, batch = self.config.encoder_layers, final.shape[1]
            return final.view(layers, 2, batch, -1).permute(2, 0, 1, 3).reshape(batch, layers, -1)

        return HeadAttnRNNEncoderOutput(
            last_hidden_state=states,
            hidden_states=(embeddings, *layer_states) if output_hidden_states else None,
            final_hidden=per_layer(final_hidden),
            final_cell=per_layer(final_cell),
            fertility=self.source_fertility(input_ids, attention_mask) if self.source_fertility is not None else None,
            sink_states=sink_states,
        )

    def _append_sink(self, embeddings: torch.Tensor, mask: torch.Tensor):
        """[batch, length, e] embeddings and their [batch, length] mask -> the same with the <SINK> embedding right
        after each sentence's last real token ([batch, length + 1, e]), the new mask, and the sink's positions
        (right padding: the sentence's length; left padding: `length`, the new last column)."""
        batch, length, _ = embeddings.shape
        indices = torch.arange(1, length + 1, device=mask.device)
        positions = (indices * mask).amax(-1)  # one past each sentence's last real token
        extended = torch.cat([embeddings, embeddings.new_zeros(batch, 1, embeddings.shape[-1])], dim=1)
        at_sink = torch.arange(length + 1, device=mask.device)[None, :] == positions[:, None]
        sink = self.sink_embedding.to(embeddings.dtype).expand(batch, 1, -1)
        sink = self.dropout(sink) if self.config.embedding_dropout else sink
        extended = torch.where(at_sink[..., None], sink, extended)
        extended_mask = torch.cat([mask, mask.new_zeros(batch, 1)], dim=1) | at_sink
        return extended, extended_mask, positions

    @staticmethod
    def _without_sink(states: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return states[:, : mask.shape[1]] * mask[..., None].to(states.dtype)


class HeadAttnRNNSourceAttention(nn.Module):
    """N-head, K-hop source attention for one decoder step, with the attention output layer (Eq. 16)."""

    def __init__(self, config: HeadAttnRNNConfig):
        super().__init__()
        d, heads = config.hidden_size, config.num_heads
        self.num_heads = heads
        self.transform = config.attention_transform
        self.exhaustion = config.exhaustion
        # s^(k) = W_a^(k) d_t (Eq. 1); Luong's "general" score for one head
        self.query_proj = nn.Linear(d, heads * d, bias=False) if config.attention_score != "dot" else None
        self.score_scale = d**-0.5 if config.attention_score == "scaled_general" else 1.0
        # v of z_tj = d_t^T (W h_j + v beta_{t-1,j}) (Malaviya et al.'s COVVECTOR), per head
        self.coverage = nn.Parameter(torch.zeros(heads, d)) if config.coverage_vector else None
        # The sink takes, with unbounded fertility, the attention no source token can (Malaviya et al., Sec. 4):
        # with sink="token" its state is the encoder's state of the <SINK> token (HeadAttnRNNEncoder), one per
        # sentence; with sink="vector" it is this learned vector, the same for every sentence.
        self.uses_sink = config.source_sink() != "none"
        self.sink_state = nn.Parameter(torch.zeros(d)) if config.source_sink() == "vector" else None
        self.second_hops = HeadHops(heads, d, config.num_hops - 1, config.hop_mode)  # Eq. 7-9 / 19
        self.output_proj = nn.Linear((heads + 1) * d, d, bias=False)  # W_o (Eq. 16)

    def attention_mask(self, attention_mask: torch.Tensor | None) -> torch.Tensor | None:
        """[batch, source_len] padding mask -> [batch, 1, source_len (+ sink)] bool, shared by all steps."""
        if attention_mask is None:
            return None
        allowed = attention_mask.bool()[:, None, :]
        return with_sink_column(allowed) if self.uses_sink else allowed

    def _weights(self, scores, queries, allowed, fertility, cumulative, sink):
        sink_scores = None
        if sink is not None:  # one learned vector [d], or each sentence's <SINK> state [batch, d]
            sink_scores = (queries @ sink if sink.dim() == 1 else (queries @ sink[:, :, None])[..., 0])
            sink_scores = sink_scores * self.score_scale
        if sink_scores is not None:  # the <SINK> as one more source token
            scores = torch.cat([scores, sink_scores[..., None]], dim=-1)
        if self.transform in CONSTRAINED:
            return constrained_attention_step(  # Malaviya et al., Eq. 4-6
                CONSTRAINED[self.transform], scores, fertility, cumulative, exhaustion=self.exhaustion,
                sink=sink_scores is not None, allowed=allowed,
            )
        if self.transform == "sparsemax":
            return sparsemax(scores, dim=-1, mask=allowed)  # Eq. 3
        scores = scores.float() if scores.dtype in (torch.float16, torch.bfloat16) else scores
        if allowed is not None:
            scores = scores.masked_fill(~allowed, torch.finfo(scores.dtype).min)
        return torch.softmax(scores, dim=-1)  # Iida et al., Eq. 2

    def forward(
        self,
        decoder_state: torch.Tensor,
        memory: torch.Tensor,
        allowed: torch.Tensor | None,
        fertility: torch.Tensor | None,
        cumulative: torch.Tensor,
        sink_states: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """decoder_state d_t [batch, d]; memory H [batch, source_len, d]; allowed from `attention_mask`;
        fertility [batch, 1, source_len]; cumulative beta [batch, heads, source_len]; sink_states [batch, d], the
        <SINK> token's encoder states (sink="token"; with sink="vector" the module's own `sink_state` is used).
        Returns o_t [batch, d], alpha_t [batch, heads, source_len (+ sink)], the head weights (or None) and the
        scores z_t [batch, heads, source_len] before the transform (what guided alignment compares with the links for
        the sparse transforms, whose weights have exact zeros: guided_alignment.py)."""
        batch, d = decoder_state.shape
        num_sources = memory.shape[1]
        if self.query_proj is not None:
            queries = self.query_proj(decoder_state).view(batch, self.num_heads, d)  # Eq. 1
        else:
            queries = decoder_state[:, None, :]
        scores = torch.einsum("bnd,bsd->bns", queries, memory) * self.score_scale  # s^(k) H^T (Eq. 2)
        if self.coverage is not None:
            scores = scores + (decoder_state @ self.coverage.T)[..., None] * cumulative
        sink = self.sink_state if self.sink_state is not None else sink_states
        if self.uses_sink and sink is None:
            raise ValueError("This source attention has a <SINK> token: pass the encoder's `sink_states`")
        weights = self._weights(scores, queries, allowed, fertility, cumulative, sink)
        source_weights = weights[..., :num_sources].to(memory.dtype)
        contexts = torch.einsum("bns,bsd->bnd", source_weights, memory)  # c^(k) (Eq. 2)
        if sink is not None:
            sink_weights = weights[..., num_sources:].to(memory.dtype)  # [batch, heads, 1]
            contexts = contexts + sink_weights * (sink if sink.dim() == 1 else sink[:, None, :])
        contexts, head_weights = self.second_hops(queries, contexts)  # c'^(k) (Eq. 7-9, 19)
        output = torch.tanh(self.output_proj(torch.cat([decoder_state, contexts.reshape(batch, -1)], dim=-1)))  # Eq. 16
        return output, weights, head_weights, scores


class HeadAttnRNNDecoder(nn.Module):
    def __init__(self, config: HeadAttnRNNConfig):
        super().__init__()
        self.config = config
        d = config.hidden_size
        self.embed_tokens = nn.Embedding(config.vocab_size, config.embedding_size, config.pad_token_id)
        self.dropout = nn.Dropout(config.dropout)
        # input feeding: the first layer reads [embed(y_{t-1}); o_{t-1}]
        self.layers = nn.ModuleList(
            [nn.LSTMCell(config.embedding_size + d if i == 0 else d, d) for i in range(config.decoder_layers)]
        )
        self.attention = HeadAttnRNNSourceAttention(config)

    def initial_states(self, encoder_outputs: HeadAttnRNNEncoderOutput, num_sources: int) -> dict[str, torch.Tensor]:
        """Decoder layer l starts from encoder layer l's final states, zeros where the encoder has no layer l."""
        final_hidden = encoder_outputs.final_hidden
        batch, encoder_layers, d = final_hidden.shape
        layers = self.config.decoder_layers
        shared = min(layers, encoder_layers)

        def start(final):
            zeros = final.new_zeros(batch, layers - shared, d)
            return torch.cat([final[:, :shared], zeros], dim=1)

        return {
            "hidden": start(final_hidden),
            "cell": start(encoder_outputs.final_cell),
            "input_feed": final_hidden.new_zeros(batch, d),
            "cumulative": final_hidden.new_zeros(batch, self.config.num_heads, num_sources),
        }

    @accepts_past_key_values
    def forward(
        self,
        input_ids: torch.LongTensor,
        encoder_outputs: HeadAttnRNNEncoderOutput,
        encoder_attention_mask: torch.Tensor | None = None,
        cache: HeadAttnRNNCache | None = None,
        use_cache: bool = False,
        output_attentions: bool = False,
        output_hidden_states: bool = False,
        output_head_importances: bool = False,
        output_guided_attention: bool = False,
    ) -> HeadAttnRNNDecoderOutput:
        memory = encoder_outputs.last_hidden_state
        num_sources = memory.shape[1]
        if use_cache and cache is None:
            cache = HeadAttnRNNCache()
        elif not use_cache:
            cache = None
        if cache is not None and not isinstance(cache, HeadAttnRNNCache):
            raise TypeError(f"HeadAttnRNN models keep their decoding state in a HeadAttnRNNCache, got "
                            f"{type(cache).__name__}")
        resumes = cache is not None and cache.get_seq_length() > 0
        states = cache.states if resumes else self.initial_states(encoder_outputs, num_sources)
        hidden, cell = list(states["hidden"].unbind(1)), list(states["cell"].unbind(1))
        input_feed, cumulative = states["input_feed"], states["cumulative"]

        allowed = self.attention.attention_mask(encoder_attention_mask)
        fertility = encoder_outputs.fertility[:, None, :].to(memory.dtype) if self.attention.transform in CONSTRAINED else None
        embeddings = self.embed_tokens(input_ids)
        embeddings = self.dropout(embeddings) if self.config.embedding_dropout else embeddings
        # Input feeding makes each step depend on the previous step's output: the loop over target positions is
        # inherent to the model, and vectorised over the batch.
        outputs, step_weights, step_head_weights, step_guided = [], [], [], []
        guided_heads = self.config.guided_alignment_heads if output_guided_attention else None
        layer_states = [[] for _ in self.layers]  # per layer, its hidden state at every step
        for t in range(unrolled_length(input_ids.shape[1], "the LSTM decoder's loop over target positions")):
            layer_input = torch.cat([embeddings[:, t], input_feed], dim=-1)
            for i, layer in enumerate(self.layers):
                hidden[i], cell[i] = layer(layer_input, (hidden[i], cell[i]))
                layer_input = self.dropout(hidden[i]) if i + 1 < len(self.layers) else hidden[i]
                if output_hidden_states:
                    layer_states[i].append(hidden[i])
            attended, weights, head_weights, scores = self.attention(hidden[-1], memory, allowed, fertility, cumulative,
                                                                     encoder_outputs.sink_states)
            if guided_heads is not None:
                step_guided.append(self.guided_attention(weights[..., :num_sources], scores, allowed, guided_heads))
            cumulative = cumulative + weights[..., :num_sources].to(cumulative.dtype)
            input_feed = self.dropout(attended)  # OpenNMT feeds the dropped-out attentional output
            outputs.append(input_feed)
            step_weights.append(weights[..., :num_sources])
            step_head_weights.append(head_weights)

        if cache is not None:
            new_states = {"hidden": torch.stack(hidden, 1), "cell": torch.stack(cell, 1), "input_feed": input_feed,
                          "cumulative": cumulative}
            cache.update_states(new_states, input_ids.shape[1])
        return HeadAttnRNNDecoderOutput(
            last_hidden_state=torch.stack(outputs, dim=1),
            **with_cache(cache),
            # As in Transformers' encoder-decoders: the embeddings, then each layer's states. Layers run one step
            # at a time (input feeding), so a layer's states over time are stacked afterwards.
            hidden_states=(
                (embeddings, *(torch.stack(states, dim=1) for states in layer_states)) if output_hidden_states else None
            ),
            cross_attentions=(torch.stack(step_weights, dim=2),) if output_attentions else None,
            head_importances=(
                torch.stack(step_head_weights, dim=1)
                if output_head_importances and step_head_weights and step_head_weights[0] is not None
                else None
            ),
            guided_attention=torch.stack(step_guided, dim=2) if guided_heads is not None else None,
        )

    def guided_attention(self, weights, scores, allowed, heads) -> torch.Tensor:
        """[batch, len(heads), source_len]: the guided heads' weights over the source tokens, or for the sparse and
        constrained transforms (exact zeros) the softmax of their scores (guided_alignment.py)."""
        if self.attention.transform == "softmax":
            return weights[:, heads]
        num_sources = scores.shape[-1]
        return scores_softmax(scores[:, heads], allowed[..., :num_sources] if allowed is not None else None)


# ------------------------------------------------------------------------------------------------ models
class HeadAttnRNNPreTrainedModel(NamesDamagedWeights, PreTrainedModel):
    config_class = HeadAttnRNNConfig
    config: HeadAttnRNNConfig
    base_model_prefix = "model"
    _is_stateful = True  # the decoder's recurrent state cannot be rewound for assisted decoding

    @torch.no_grad()
    def _init_weights(self, module):
        """Every parameter uniform in [-init_range, init_range] (OpenNMT's `param_init`), padding rows zero."""
        for parameter in module.parameters(recurse=False):
            init.uniform_(parameter, -self.config.init_range, self.config.init_range)
        if isinstance(module, nn.Embedding) and module.padding_idx is not None:
            if not getattr(module.weight, "_is_hf_initialized", False):
                module.weight[module.padding_idx].zero_()

    @classmethod
    def _supports_default_dynamic_cache(cls) -> bool:
        return False  # the model makes its own HeadAttnRNNCache on the first decoding step

    def save_pretrained(self, save_directory, *args, **kwargs):
        """Save weights, config and code (see `HeadAttnPreTrainedModel.save_pretrained`)."""
        check_code_travels(type(self))
        super().save_pretrained(save_directory, *args, **kwargs)

    def check_inputs(self, **arguments) -> None:
        """Raise ValueError for inputs that `forward` or `generate` cannot use (`check_seq2seq_inputs`, with this
        model's vocabularies; the LSTM reads token ids only); called before any work."""
        target_vocab_size = self.get_decoder().embed_tokens.num_embeddings
        output_embeddings = self.get_output_embeddings()
        check_seq2seq_inputs(
            source_vocab_size=self.get_encoder().embed_tokens.num_embeddings,
            target_vocab_size=target_vocab_size,
            label_vocab_size=output_embeddings.out_features if output_embeddings is not None else target_vocab_size,
            width=None,
            **arguments,
        )


class HeadAttnRNNModel(HeadAttnRNNPreTrainedModel):
    """The bare LSTM encoder-decoder: returns the attentional outputs o_t (no output layer)."""

    def __init__(self, config: HeadAttnRNNConfig):
        super().__init__(config)
        self.encoder = HeadAttnRNNEncoder(config)
        self.decoder = HeadAttnRNNDecoder(config)
        self.post_init()

    def get_input_embeddings(self) -> nn.Embedding:
        return self.encoder.embed_tokens

    def set_input_embeddings(self, value: nn.Embedding) -> None:
        self.encoder.embed_tokens = value

    def get_encoder(self, modality: str | None = None):
        """The text encoder; for another modality, `PreTrainedModel.get_encoder`'s answer (this model itself)."""
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
        encoder_outputs: HeadAttnRNNEncoderOutput | None = None,
        cache: HeadAttnRNNCache | None = None,
        use_cache: bool | None = None,
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
        output_head_importances: bool = False,
        output_guided_attention: bool = False,
        return_dict: bool | None = None,
    ) -> Seq2SeqModelOutput:
        r"""
        decoder_attention_mask: accepted for API compatibility and unused: decoder step t reads only positions
            up to t, so padding after a target sentence cannot change its outputs.
        output_head_importances (`bool`): return the last dependent hop's weights over heads per target token.
        output_guided_attention (`bool`): return the guided heads' distributions over the source tokens
            (`outputs.guided_attention`, guided_alignment.py).
        """
        output_attentions = output_attentions if output_attentions is not None else self.config.output_attentions
        output_hidden_states = (
            output_hidden_states if output_hidden_states is not None else self.config.output_hidden_states
        )
        use_cache = use_cache if use_cache is not None else self.config.use_cache
        if encoder_outputs is None:
            encoder_outputs = self.encoder(input_ids, attention_mask, output_hidden_states=output_hidden_states)
        if decoder_input_ids is None:
            raise ValueError("Pass `decoder_input_ids` (or `labels` to the model with a language-model head)")
        decoder_outputs = self.decoder(
            decoder_input_ids,
            encoder_outputs,
            encoder_attention_mask=attention_mask,
            cache=cache,
            use_cache=use_cache,
            output_attentions=output_attentions,
            output_hidden_states=output_hidden_states,
            output_head_importances=output_head_importances,
            output_guided_attention=output_guided_attention,
        )
        output = HeadAttnRNNSeq2SeqModelOutput(
            last_hidden_state=decoder_outputs.last_hidden_state,
            **with_cache(cache_of(decoder_outputs)),
            decoder_hidden_states=decoder_outputs.hidden_states,
            cross_attentions=decoder_outputs.cross_attentions,
            encoder_last_hidden_state=encoder_outputs.last_hidden_state,
            encoder_hidden_states=encoder_outputs.hidden_states,
            head_importances=decoder_outputs.head_importances,
            guided_attention=decoder_outputs.guided_attention,
        )
        return output.to_tuple() if return_dict is False else output


class HeadAttnRNNForConditionalGeneration(HeadAttnRNNPreTrainedModel, GenerationMixin):
    """The LSTM encoder-decoder with its output layer; the loss is label-smoothed cross-entropy, normalised so
    that gradient accumulation gives the same result."""

    accepts_loss_kwargs = True  # Trainer passes num_items_in_batch

    def __init__(self, config: HeadAttnRNNConfig):
        super().__init__(config)
        self.model = HeadAttnRNNModel(config)
        self.generator = nn.Linear(config.hidden_size, config.vocab_size)  # p(y_t) = softmax(W o_t + b)
        self.post_init()

    def get_encoder(self, modality: str | None = None):
        """The text encoder; for another modality, `PreTrainedModel.get_encoder`'s answer (this model itself)."""
        return self.model.encoder if modality is None else super().get_encoder(modality=modality)

    def get_decoder(self):
        return self.model.decoder

    def get_input_embeddings(self) -> nn.Embedding:
        return self.model.encoder.embed_tokens

    def get_output_embeddings(self) -> nn.Linear:
        return self.generator

    def set_output_embeddings(self, new_embeddings: nn.Linear) -> None:
        self.generator = new_embeddings

    def resize_token_embeddings(self, new_num_tokens=None, pad_to_multiple_of=None, mean_resizing=True):
        """Resize the joint vocabulary everywhere: the encoder embeddings and the generator (Transformers'
        method) and the decoder's own embeddings."""
        embeddings = super().resize_token_embeddings(new_num_tokens, pad_to_multiple_of, mean_resizing)
        decoder = self.model.decoder
        decoder.embed_tokens = self._get_resized_embeddings(decoder.embed_tokens, embeddings.num_embeddings,
                                                            mean_resizing=mean_resizing)
        return embeddings

    @accepts_past_key_values
    @checks_inputs
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        decoder_input_ids: torch.LongTensor | None = None,
        decoder_attention_mask: torch.Tensor | None = None,
        encoder_outputs: HeadAttnRNNEncoderOutput | None = None,
        cache: HeadAttnRNNCache | None = None,
        labels: torch.LongTensor | None = None,
        use_cache: bool | None = None,
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
        output_head_importances: bool = False,
        return_dict: bool | None = None,
        num_items_in_batch: int | torch.Tensor | None = None,
        alignment_links: torch.Tensor | None = None,
    ) -> HeadAttnRNNSeq2SeqLMOutput:
        r"""
        labels (`torch.LongTensor` of shape `(batch, target_length)`, *optional*): target ids, -100 where
            ignored; decoder inputs are derived from them when not given.
        alignment_links (`torch.Tensor` of shape `(batch, target_length, source_length)`, *optional*): per label
            position a distribution over the source tokens it is linked to (zeros: no link); with `labels`, the
            guided heads' cost against it is `outputs.alignment_loss`, added to the loss with
            `config.guided_alignment_weight` (as in `HeadAttnForConditionalGeneration`).
        num_items_in_batch (`int`, *optional*): label tokens across all micro-batches of one optimizer step
            (passed by `Trainer`), so that gradient accumulation matches one large batch.
        """
        if labels is not None:
            use_cache = False
            if decoder_input_ids is None:
                decoder_input_ids = shift_tokens_right(labels, self.config.pad_token_id,
                                                       self.config.decoder_start_token_id)
        outputs = self.model(
            input_ids,
            attention_mask=attention_mask,
            decoder_input_ids=decoder_input_ids,
            encoder_outputs=encoder_outputs,
            cache=cache,
            use_cache=use_cache,
            output_attentions=output_attentions,
            output_hidden_states=output_hidden_states,
            output_head_importances=output_head_importances,
            output_guided_attention=alignment_links is not None,
        )
        logits = self.generator(outputs.last_hidden_state)
        loss = ce_loss = alignment_loss = None
        if alignment_links is not None and labels is None:
            raise ValueError("`alignment_links` come with the `labels` they align: pass both (the cost is normalised "
                             "like the cross-entropy of the labels)")
        if labels is not None:
            loss, _ = seq2seq_loss(logits, labels, self.config.label_smoothing, num_items_in_batch=num_items_in_batch)
            ce_loss = loss
        if alignment_links is not None:
            alignment_loss = guided_alignment_loss(outputs.guided_attention, alignment_links,
                                                   self.config.guided_alignment_cost, labels)
            loss = loss + weighted_for_step(alignment_loss, self.config.guided_alignment_weight, labels,
                                            num_items_in_batch)
        output = HeadAttnRNNSeq2SeqLMOutput(
            loss=loss,
            ce_loss=ce_loss if alignment_links is not None else None,
            alignment_loss=alignment_loss,
            guided_attention=outputs.guided_attention,
            logits=logits,
            **with_cache(cache_of(outputs)),
            decoder_hidden_states=outputs.decoder_hidden_states,
            cross_attentions=outputs.cross_attentions,
            encoder_last_hidden_state=outputs.encoder_last_hidden_state,
            encoder_hidden_states=outputs.encoder_hidden_states,
            head_importances=outputs.head_importances,
        )
        return output.to_tuple() if return_dict is False else output

    def prepare_decoder_input_ids_from_labels(self, labels: torch.Tensor) -> torch.Tensor:
        return shift_tokens_right(labels, self.config.pad_token_id, self.config.decoder_start_token_id)

    def prepare_inputs_for_generation(self, *args, **kwargs):
        return drop_cache_position(super().prepare_inputs_for_generation(*args, **kwargs))

    def generate(self, inputs=None, *args, coverage_penalty: float = 0.0, coverage_epsilon: float = 0.1, **kwargs):
        """`GenerationMixin.generate`, plus Wu et al.'s coverage penalty as Malaviya et al. used it: with
        `coverage_penalty=beta > 0`, beam search keeps all `num_beams` hypotheses, each gets
        cp = beta * sum_j log max(epsilon, min(1, sum_t alpha_tj)) added to its beam score (which already holds
        the length penalty), and the hypotheses are re-ranked by the sum. alpha is the attention averaged over
        heads, from one teacher-forced pass over each hypothesis (every step depends only on the source and the
        prefix, so it is what decoding computed). Returns the best `num_return_sequences` per sentence, as
        `generate` does (a `HeadAttnRNNGenerateOutput` with `return_dict_in_generate=True`)."""
        if (not isinstance(coverage_penalty, (int, float)) or isinstance(coverage_penalty, bool)
                or not math.isfinite(coverage_penalty) or coverage_penalty < 0):
            raise ValueError(f"`coverage_penalty` (beta) must be a finite number >= 0, got {coverage_penalty!r}")
        if not isinstance(coverage_epsilon, (int, float)) or not 0 < coverage_epsilon <= 1:
            raise ValueError(f"`coverage_epsilon` must be a number in (0, 1], got {coverage_epsilon!r}")
        check_generate_inputs(self, inputs, kwargs)
        check_generation_counts(self.generation_config, kwargs)
        with inputs_checked_by_caller():  # the decoding steps' inputs come from generate itself
            if not coverage_penalty:
                return super().generate(inputs, *args, **kwargs)
            return self._generate_with_coverage_penalty(inputs, coverage_penalty, coverage_epsilon, *args, **kwargs)

    def _generate_with_coverage_penalty(self, inputs, beta, epsilon, *args, **kwargs):
        generation_config = kwargs.get("generation_config") or self.generation_config
        num_beams = kwargs.get("num_beams", generation_config.num_beams)
        num_return = kwargs.get("num_return_sequences", generation_config.num_return_sequences) or 1
        if num_beams is None or num_beams < 2:
            raise ValueError(f"The coverage penalty re-ranks beam hypotheses; use num_beams >= 2, got {num_beams!r}")
        source_ids = inputs if inputs is not None else kwargs.get("input_ids")
        if source_ids is None:
            raise ValueError("generate(coverage_penalty=...) needs the source token ids (`input_ids`)")
        return_dict = kwargs.pop("return_dict_in_generate", generation_config.return_dict_in_generate)
        kwargs.update(num_beams=num_beams, num_return_sequences=num_beams, return_dict_in_generate=True,
                      output_scores=True)
        generated = super().generate(inputs, *args, **kwargs)
        if not isinstance(generated, GenerateBeamEncoderDecoderOutput):
            raise ValueError("The coverage penalty needs beam search (do_sample=False, num_beams >= 2)")
        sequences = generated.sequences
        attention_mask = kwargs.get("attention_mask")
        source_mask = (attention_mask if attention_mask is not None else torch.ones_like(source_ids))
        source_mask = source_mask.repeat_interleave(num_beams, dim=0)
        cumulative = self.cumulative_attention(source_ids.repeat_interleave(num_beams, dim=0), source_mask, sequences)
        penalties = coverage_penalty(cumulative, source_mask, beta, epsilon)
        scores = (generated.sequences_scores + penalties).view(-1, num_beams)
        order = scores.argsort(dim=-1, descending=True, stable=True)[:, :num_return]
        chosen = (order + torch.arange(scores.shape[0], device=order.device)[:, None] * num_beams).reshape(-1)
        if not return_dict:
            return sequences[chosen]
        return HeadAttnRNNGenerateOutput(
            sequences=sequences[chosen], sequences_scores=scores.reshape(-1)[chosen], coverage_penalties=penalties[chosen]
        )

    @torch.no_grad()
    def cumulative_attention(
        self, input_ids: torch.LongTensor, attention_mask: torch.Tensor | None, sequences: torch.LongTensor
    ) -> torch.Tensor:
        """sum_t alpha_tj [batch, source_len] of generated `sequences` (starting with the decoder start token),
        averaged over heads, over the steps that produced a token up to and including the first EOS."""
        outputs = self(input_ids=input_ids, attention_mask=attention_mask, decoder_input_ids=sequences[:, :-1],
                       output_attentions=True, use_cache=False)
        attention = outputs.cross_attentions[0].mean(dim=1)  # [batch, steps, source_len]
        produced = sequences[:, 1:]
        eos_seen_before = (produced == self.config.eos_token_id).int().cumsum(dim=1) - (
            produced == self.config.eos_token_id).int()
        real_steps = eos_seen_before == 0
        return (attention * real_steps[..., None].to(attention.dtype)).sum(dim=1)


# save_pretrained copies each class's module and its relative imports, and names it in config.json's auto_map
HeadAttnRNNModel.register_for_auto_class("AutoModel")
HeadAttnRNNForConditionalGeneration.register_for_auto_class("AutoModelForSeq2SeqLM")


__all__ = [
    "HeadAttnRNNEncoderOutput",
    "HeadAttnRNNForConditionalGeneration",
    "HeadAttnRNNGenerateOutput",
    "HeadAttnRNNModel",
    "HeadAttnRNNPreTrainedModel",
    "HeadAttnRNNSeq2SeqLMOutput",
    "HeadAttnRNNSeq2SeqModelOutput",
    "coverage_penalty",
]
