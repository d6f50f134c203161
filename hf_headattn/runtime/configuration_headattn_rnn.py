"""Configuration of the attentional LSTM encoder-decoder (Luong et al., 2015) that the multi-hop (Iida et al.,
2019) and sparse/constrained attention (Malaviya et al., 2018) papers build on."""

from typing import TYPE_CHECKING

from transformers import PretrainedConfig

from .attention_multihop import MULTIHOP_PAPER, check_hop_mode
from .attention_sparse import MALAVIYA_2018
from .configuration_headattn import (CUSTOM_PIPELINES, check_fractions, check_model_type, check_positive_integers,
                                     check_token_ids)
from .fertility import check_fertility_config, describe_fertility
from .guided_alignment import DEFAULT_GUIDED_HEADS, check_guided_alignment_config
from .remote_code import check_code_travels
from .transformers_compat import CACHE_NAME, validate_base_architecture
# Transformers before 5.10 copies into its modules cache only the modules that a remote-code entry (a module named
# in config.json's auto_map) imports directly, so entries also import the modules their imports need
# (tests/test_remote_code.py checks it).
from .attention_backends import softmax_attention  # noqa: F401
from .attention_base import AttentionVariant  # noqa: F401
from .attention_dhicm import DynamicHeadImportanceAttention  # noqa: F401
from .attention_entmax import Entmax15Attention  # noqa: F401
from .attention_mma import MixedMultiHeadAttention  # noqa: F401
from .attention_registry import ATTENTION_VARIANTS  # noqa: F401
from .attention_running_sum import RunningSumAttention  # noqa: F401
from .attention_softmax import SoftmaxAttention  # noqa: F401
from .attention_sparse import SparsemaxAttention  # noqa: F401
from .rnn_packing import run_packed_lstm  # noqa: F401
from .seq2seq_common import inputs_checked_elsewhere  # noqa: F401
from .sparse_attention import sparsemax  # noqa: F401
from .sparse_solvers import solve_sparsemax  # noqa: F401
# The Triton kernels import triton, which a saved model must load without: named here for the copy only (never run),
# they are imported where a kernel runs (`sparse_attention.kernel_backend`).
if TYPE_CHECKING:
    from .triton_kernels import constrained_scan  # noqa: F401


ATTENTION_SCORES = ("general", "scaled_general", "dot")
ATTENTION_TRANSFORMS = ("softmax", "sparsemax", "csoftmax", "csparsemax")
CONSTRAINED_TRANSFORMS = ("csoftmax", "csparsemax")
SINKS = ("token", "vector", "none")
LUONG_PAPER = ("Luong, Pham & Manning (2015), *Effective Approaches to Attention-based Neural Machine Translation*: "
               "the attentional LSTM encoder-decoder with input feeding.")
COVERAGE_VECTOR_PAPER = "Tu, Lu, Liu, Liu & Li (2016), *Modeling Coverage for Neural Machine Translation*: the coverage vector."
SOURCE_ATTENTION = "source attention"  # the one attention module's name, in outputs, plots and the web page

AUTO_MAP = {
    "AutoConfig": "configuration_headattn_rnn.HeadAttnRNNConfig",
    "AutoModel": "modeling_headattn_rnn.HeadAttnRNNModel",
    "AutoModelForSeq2SeqLM": "modeling_headattn_rnn.HeadAttnRNNForConditionalGeneration",
}


class HeadAttnRNNConfig(PretrainedConfig):
    r"""
    Configuration of [`HeadAttnRNNForConditionalGeneration`]: embeddings, a bidirectional LSTM encoder, an LSTM
    decoder with input feeding, and multi-head, multi-hop source attention whose weights come from a choice of
    transformations.

    Args:
        vocab_size (`int`, defaults to 8000): Size of the joint source/target vocabulary (source and target
            embeddings are separate matrices over it).
        embedding_size (`int`, defaults to 512): Size of the token embeddings.
        hidden_size (`int`, defaults to 1024): d, the decoder state size and the size of the encoder states the
            attention reads (each encoder direction has d / 2 units, so d must be even); also the size of every
            head's query and context.
        encoder_layers / decoder_layers (`int`, defaults to 1): LSTM layers. Decoder layer l starts from the final
            states of encoder layer l (both directions concatenated), or from zeros when the encoder has no
            layer l.
        dropout (`float`, defaults to 0.3): Dropout between LSTM layers, on the attentional output o_t and, with
            `embedding_dropout`, on the embeddings.
        embedding_dropout (`bool`, defaults to `True`): Apply `dropout` to the source and target embeddings.
            OpenNMT-py's 2017 LSTM, which Malaviya et al. trained, has none there (`--preset malaviya2018` sets
            false).
        attention_score (`str`, defaults to `"general"`): Luong's `"general"` (bilinear, z = (W_a^(k) d_t)^T h_j;
            Malaviya et al.'s choice and Iida et al.'s Eq. 1-2), `"scaled_general"` (the same divided by
            sqrt(hidden_size), as Transformers scale theirs; the sink's score too, not the coverage term) or `"dot"`
            (z = d_t^T h_j; one head only, since without W_a every head would be the same).
        num_heads (`int`, defaults to 1): N, the heads of the source attention (Iida et al., Eq. 1-2).
        num_hops (`int`, defaults to 1): K, the hops, counting the first: K - 1 second-level hops over the heads
            (Eq. 7-9 or 19). N = 1, K = 1 is Luong's attention.
        hop_mode (`str`, defaults to `"dependent"`): `"dependent"` (Eq. 7-9: shared W_b, v_b and a softmax over
            heads) or `"independent"` (Eq. 19).
        attention_transform (`str`, defaults to `"softmax"`): How scores become attention weights, per head:
            `"softmax"`, `"sparsemax"`, `"csoftmax"` or `"csparsemax"` (Malaviya et al., Eq. 3-6); the
            constrained two bound each source token's cumulative attention by its fertility.
        exhaustion (`float`, defaults to 0.2): c of the exhaustion bonus z' = z + c u (constrained transforms).
        sink (`str`, defaults to `"token"`): Where the constrained transforms put the attention no source token can
            take any more, so that every step stays feasible (a <SINK> with unbounded fertility and no exhaustion
            bonus). `"token"` (Malaviya et al., Sec. 4, and the default): a <SINK> token appended to every source
            sentence after its last token, with its own learned embedding, read by the encoder like any token, so
            that the sink's state depends on the sentence and the sentence's states on the sink. `"vector"`: one
            learned state the encoder never reads (this package's earlier sink; configs saved with
            `sink_token: true` load as it). `"none"`: no sink (`sink_token: false`).
        sink_every_transform (`bool`, defaults to `False`): With `sink="token"`, append the <SINK> token for softmax
            and sparsemax attention too, where it is one more source token the attention may weigh (no bounds to
            satisfy): Malaviya et al.'s running scripts append it to every source sentence whatever the transform,
            so that their softmax baseline reads the same source. By default softmax and sparsemax use no sink.
        coverage_vector (`bool`, defaults to `False`): Tu et al.'s coverage vector as adapted by Malaviya et al.:
            z_tj = d_t^T (W h_j + v beta_{t-1,j}), with a learned v per head and beta the head's cumulative
            attention.
        fertility / constant_fertility / fertility_predictor_size / max_fertility: The fertility strategy of the
            constrained transforms, as in [`HeadAttnConfig`].
        label_smoothing (`float`, defaults to 0.0): Label smoothing of the model's own cross-entropy loss.
        init_range (`float`, defaults to 0.1): Parameters start uniform in [-init_range, init_range] (OpenNMT's
            default, which Malaviya et al. used).
        pad_token_id / eos_token_id / decoder_start_token_id (`int`, defaults to 0 / 1 / 0): Special token ids.
        guided_alignment_weight / guided_alignment_cost / guided_alignment_heads: Guided alignment of the source
            attention's heads, as in [`HeadAttnConfig`] (the LSTM has one source attention, so no layer to choose).
            With the sparse and constrained transforms the cost compares the links with the softmax of the heads'
            scores (`guided_alignment.py`).
    """

    model_type = "headattn_rnn"
    keys_to_ignore_at_inference = [CACHE_NAME]
    attribute_map = {"num_hidden_layers": "decoder_layers", "num_attention_heads": "num_heads"}

    def __init__(
        self,
        vocab_size: int = 8000,
        embedding_size: int = 512,
        hidden_size: int = 1024,
        encoder_layers: int = 1,
        decoder_layers: int = 1,
        dropout: float = 0.3,
        embedding_dropout: bool = True,
        attention_score: str = "general",
        num_heads: int = 1,
        num_hops: int = 1,
        hop_mode: str = "dependent",
        attention_transform: str = "softmax",
        exhaustion: float = 0.2,
        sink: str = "token",
        sink_every_transform: bool = False,
        coverage_vector: bool = False,
        fertility: str = "constant",
        constant_fertility: float = 2.0,
        fertility_predictor_size: int = 128,
        max_fertility: int = 10,
        label_smoothing: float = 0.0,
        init_range: float = 0.1,
        use_cache: bool = True,
        pad_token_id: int = 0,
        eos_token_id: int = 1,
        decoder_start_token_id: int = 0,
        guided_alignment_weight: float = 0.0,
        guided_alignment_cost: str = "ce",
        guided_alignment_heads: list[int] | None = None,
        **kwargs,
    ):
        self.vocab_size = vocab_size
        self.embedding_size = embedding_size
        self.hidden_size = hidden_size
        self.encoder_layers = encoder_layers
        self.decoder_layers = decoder_layers
        self.dropout = dropout
        self.embedding_dropout = embedding_dropout
        self.attention_score = attention_score
        self.num_heads = num_heads
        self.num_hops = num_hops
        self.hop_mode = hop_mode
        self.attention_transform = attention_transform
        self.exhaustion = exhaustion
        if "sink_token" in kwargs:  # the boolean of configs saved before `sink` had a choice of kinds
            sink = "vector" if kwargs.pop("sink_token") else "none"
        self.sink = sink
        self.sink_every_transform = sink_every_transform
        self.coverage_vector = coverage_vector
        self.fertility = fertility
        self.constant_fertility = constant_fertility
        self.fertility_predictor_size = fertility_predictor_size
        self.max_fertility = max_fertility
        self.label_smoothing = label_smoothing
        self.init_range = init_range
        self.use_cache = use_cache
        self.guided_alignment_weight = guided_alignment_weight
        self.guided_alignment_cost = guided_alignment_cost
        self.guided_alignment_heads = list(guided_alignment_heads if guided_alignment_heads is not None
                                           else DEFAULT_GUIDED_HEADS)
        kwargs.setdefault("auto_map", dict(AUTO_MAP))
        kwargs.setdefault("custom_pipelines", dict(CUSTOM_PIPELINES))
        kwargs.setdefault("is_encoder_decoder", True)
        kwargs.setdefault("tie_word_embeddings", False)
        super().__init__(
            pad_token_id=pad_token_id,
            eos_token_id=eos_token_id,
            decoder_start_token_id=decoder_start_token_id,
            **kwargs,
        )
        self.validate_architecture()

    @classmethod
    def from_dict(cls, config_dict: dict, **kwargs):
        check_model_type(cls, config_dict)
        return super().from_dict(config_dict, **kwargs)

    def save_pretrained(self, save_directory, *args, **kwargs):
        """Save config.json and this module's code (see `remote_code`), checked complete before anything is
        written."""
        self.validate_architecture()  # Transformers 5 runs it through `validate`; 4.57 does not
        check_code_travels(type(self))
        super().save_pretrained(save_directory, *args, **kwargs)

    def validate_architecture(self) -> None:
        """Raise ValueError, naming the bad value and what would be accepted, for any inconsistent field (also
        run by `save_pretrained`)."""
        validate_base_architecture(super())
        check_positive_integers(self, ("vocab_size", "embedding_size", "hidden_size", "encoder_layers",
                                       "decoder_layers", "num_heads", "num_hops"))
        if self.hidden_size % 2:
            raise ValueError(f"`hidden_size` must be even (each encoder direction has hidden_size / 2 units), got "
                             f"{self.hidden_size}")
        check_fractions(self, ("dropout", "label_smoothing"))
        from .attention_base import check_number

        check_number("`init_range`", self.init_range, above=0)
        check_number("`exhaustion` (c of z' = z + c u)", self.exhaustion, at_least=0)
        check_number("`constant_fertility`", self.constant_fertility, above=0)
        if self.attention_score not in ATTENTION_SCORES:
            raise ValueError(f"Unknown attention_score {self.attention_score!r}; accepted: {', '.join(ATTENTION_SCORES)}")
        if self.attention_score == "dot" and self.num_heads != 1:
            raise ValueError(f"attention_score='dot' has no per-head W_a, so all {self.num_heads} heads would be the "
                             "same; use num_heads=1 or attention_score='general'")
        check_hop_mode(self.hop_mode)
        if self.attention_transform not in ATTENTION_TRANSFORMS:
            raise ValueError(f"Unknown attention_transform {self.attention_transform!r}; accepted: "
                             f"{', '.join(ATTENTION_TRANSFORMS)}")
        if self.sink not in SINKS:
            raise ValueError(f"Unknown sink {self.sink!r}; accepted: {', '.join(SINKS)}")
        for field in ("embedding_dropout", "sink_every_transform", "coverage_vector"):
            if not isinstance(getattr(self, field), bool):
                raise ValueError(f"`{field}` must be true or false, got {getattr(self, field)!r}")
        check_fertility_config(self)
        check_token_ids(self, dict.fromkeys(("pad_token_id", "eos_token_id", "decoder_start_token_id"),
                                            self.vocab_size))
        check_guided_alignment_config(self, None, self.num_heads)

    def uses_fertility(self) -> bool:
        """Whether the attention bounds each source token's attention by its fertility."""
        return self.attention_transform in CONSTRAINED_TRANSFORMS

    def source_sink(self) -> str:
        """The sink the source attention uses: `sink`, for the constrained transforms (and with
        `sink_every_transform` a <SINK> token for the others); "none" otherwise."""
        if self.uses_fertility() or (self.sink == "token" and self.sink_every_transform):
            return self.sink
        return "none"

    # ------------------------------------------------------------------------ what the tooling asks of the family
    # The same questions HeadAttnConfig answers, so that cards, the web page, plots and the commands never test a
    # model type.
    family = "lstm"  # the model card template (model_cards/<family>.md) and the family's tag

    def attention_variant_names(self) -> list[str]:
        """The attention transform, the one variant an LSTM's source attention uses."""
        return [self.attention_transform]

    def papers(self) -> list[str]:
        """The citations a model card lists: Luong et al., then the multi-hop, sparse and coverage papers the
        configuration uses."""
        papers = [LUONG_PAPER]
        if self.num_heads > 1 or self.num_hops > 1:
            papers.append(MULTIHOP_PAPER)
        if self.attention_transform != "softmax" or self.coverage_vector:
            papers.append(MALAVIYA_2018)
        if self.coverage_vector:
            papers.append(COVERAGE_VECTOR_PAPER)
        return papers

    def card_tags(self) -> list[str]:
        """The family's own Hub tags (the variants' names are tagged by the card)."""
        return ["lstm", *(tag for tag, used in (("multi-head-attention", self.num_heads > 1),
                                                 ("multi-hop-attention", self.num_hops > 1),
                                                 ("coverage-vector", self.coverage_vector)) if used)]

    def describe(self) -> str:
        """One line saying which attention the model uses (the web page's model description)."""
        hops = f" x {self.num_hops} hops ({self.hop_mode})" if self.num_hops > 1 else ""
        text = f"LSTM encoder-decoder; source attention: {self.attention_transform}, {self.num_heads} head(s){hops}"
        return text + (f"; fertility {self.fertility}" if self.uses_fertility() else "")

    def describe_architecture(self) -> list[str]:
        """The architecture in sentences, for the model card (the card adds the parameter count to the first)."""
        def count(number: int, noun: str) -> str:
            return f"{number} {noun}{'s' * (number != 1)}"

        lines = [
            f"LSTM encoder-decoder: {count(self.encoder_layers, 'bidirectional encoder layer')} "
            f"({self.hidden_size // 2} units per direction) and {count(self.decoder_layers, 'decoder layer')} "
            f"with input feeding, embeddings {self.embedding_size}, hidden size {self.hidden_size}, vocabulary "
            f"{self.vocab_size:,}",
            f"Source attention: {count(self.num_heads, 'head')} x {count(self.num_hops, 'hop')}"
            + (f" ({self.hop_mode} hops)" if self.num_hops > 1 else "")
            + f", `{self.attention_score}` scores, `{self.attention_transform}` weights.",
        ]
        if self.uses_fertility():
            sink = {"token": "a <SINK> token read by the encoder", "vector": "a learned vector", "none": "none"}
            lines.append(f"Fertility: {describe_fertility(self)}; sink: {sink[self.sink]}; exhaustion c = "
                         f"{self.exhaustion:g}.")
        elif self.source_sink() == "token":
            lines.append("A <SINK> token, read by the encoder, ends every source sentence (as in Malaviya et al.'s "
                         "running scripts, whatever the transform).")
        lines.append(f"Coverage vector (Tu et al., 2016): {'yes' if self.coverage_vector else 'no'}.")
        return lines

    @property
    def cross_attention_layers(self) -> int:
        """How many cross-attention layers the model returns (`outputs.cross_attentions`): the one source attention."""
        return 1

    def cross_attention_module(self, layer_idx: int) -> str:
        return SOURCE_ATTENTION

    def cross_attention_variant(self, layer_idx: int) -> tuple[str, dict]:
        """The source attention's transform, and whether a sink takes the attention no source token can."""
        return self.attention_transform, ({"sink": True} if self.source_sink() != "none" else {})

    def cross_attention_heads(self, layer_idx: int) -> list[int]:
        return list(range(self.num_heads))

    def cross_attention_label(self, layer_idx: int) -> str:
        return SOURCE_ATTENTION

    def guided_alignment(self) -> tuple[int, list[int]] | None:
        """(0, the guided heads) for a model trained with guided alignment, else None (as [`HeadAttnConfig`])."""
        return (0, list(self.guided_alignment_heads)) if self.guided_alignment_weight else None

    def constrained_cross_attention(self, layer_idx: int) -> bool | None:
        """None unless the transform is bounded by fertilities; else whether a sink takes what the bounds leave."""
        return self.source_sink() != "none" if self.uses_fertility() else None

    def head_weighting_modules(self) -> dict[str, str]:
        """The source attention when dependent hops weigh its heads (Iida et al., Eq. 7-9)."""
        weighs = self.num_hops > 1 and self.hop_mode == "dependent"
        return {SOURCE_ATTENTION: f"multi-hop ({self.num_hops} dependent hops), last hop"} if weighs else {}


# save_pretrained copies this module and its relative imports, and names it in config.json's auto_map
HeadAttnRNNConfig.register_for_auto_class()


__all__ = ["HeadAttnRNNConfig"]
