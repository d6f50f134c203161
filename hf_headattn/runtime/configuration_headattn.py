"""Configuration of the Marian-style encoder-decoder with pluggable attention."""

from typing import TYPE_CHECKING, Any

from transformers import PretrainedConfig

from .attention_base import CROSS_ATTENTION, DECODER_SELF_ATTENTION, ENCODER_SELF_ATTENTION, SITES
from .attention_registry import ATTENTION_VARIANTS, get_attention_variant
from .fertility import check_fertility_config, describe_fertility
from .guided_alignment import DEFAULT_GUIDED_HEADS, DEFAULT_GUIDED_LAYER, check_guided_alignment_config
from .remote_code import check_code_travels
from .transformers_compat import CACHE_NAME, validate_base_architecture
# Transformers before 5.10 copies into its modules cache only the modules that a remote-code entry (a module named
# in config.json's auto_map) imports directly, so entries also import the modules their imports need
# (tests/test_remote_code.py checks it).
from .attention_backends import softmax_attention  # noqa: F401
from .attention_dhicm import DynamicHeadImportanceAttention  # noqa: F401
from .attention_entmax import Entmax15Attention  # noqa: F401
from .attention_mma import MixedMultiHeadAttention  # noqa: F401
from .attention_multihop import MultiHopAttention  # noqa: F401
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


POSITION_EMBEDDINGS = ("sinusoidal", "none")
TRANSFORMER_PAPER = ("Vaswani et al. (2017), *Attention Is All You Need*: the Transformer; the layout (post-LN, "
                     "sinusoidal positions, final logits bias) follows Marian (Junczys-Dowmunt et al., 2018).")
_SITE_TITLES = {ENCODER_SELF_ATTENTION: "Encoder self-attention", DECODER_SELF_ATTENTION: "Decoder self-attention",
                CROSS_ATTENTION: "Cross-attention"}
_MODULE_NAMES = {
    ENCODER_SELF_ATTENTION: ("encoder", "self_attn"),
    DECODER_SELF_ATTENTION: ("decoder", "self_attn"),
    CROSS_ATTENTION: ("decoder", "encoder_attn"),
}

AUTO_MAP = {
    "AutoConfig": "configuration_headattn.HeadAttnConfig",
    "AutoModel": "modeling_headattn.HeadAttnModel",
    "AutoModelForSeq2SeqLM": "modeling_headattn.HeadAttnForConditionalGeneration",
}
CUSTOM_PIPELINES = {
    "translation": {
        "impl": "pipeline_headattn.TranslationPipeline",
        "pt": ["AutoModelForSeq2SeqLM"],
        "type": "text",
    }
}


def check_positive_integers(config, fields) -> None:
    """Raise ValueError naming the first of `fields` that is not an integer >= 1."""
    for field in fields:
        value = getattr(config, field)
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"`{field}` must be a positive integer, got {value!r}")


def check_fractions(config, fields) -> None:
    """Raise ValueError naming the first of `fields` (dropout-like rates) that is not a number in [0, 1)."""
    for field in fields:
        value = getattr(config, field)
        if not isinstance(value, (int, float)) or isinstance(value, bool) or not 0.0 <= value < 1.0:
            raise ValueError(f"`{field}` must be a number in [0, 1), got {value!r}")


def check_model_type(config_class, config_dict: dict) -> None:
    """Refuse a config.json of another model type (an LSTM folder loaded with the Transformer class, or the
    reverse), which Transformers only warns about before building the wrong model from it."""
    model_type = config_dict.get("model_type")
    if model_type is not None and model_type != config_class.model_type:
        raise ValueError(f"this config.json is of model type {model_type!r}, and {config_class.__name__} reads model "
                         f"type {config_class.model_type!r} only; load it with the classes of {model_type!r} (or "
                         "AutoConfig / AutoModelForSeq2SeqLM, which pick them)")


def check_token_ids(config, limits: dict[str, int]) -> None:
    """Raise ValueError naming the first special-token field (name -> vocabulary limit) outside [0, limit)."""
    for field, limit in limits.items():
        value = getattr(config, field)
        if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value < limit:
            raise ValueError(f"`{field}` must be an integer in [0, {limit}) for this vocabulary, got {value!r}")


class HeadAttnConfig(PretrainedConfig):
    r"""
    Configuration of [`HeadAttnForConditionalGeneration`]: Marian's architecture (post-LN Transformer
    encoder-decoder, sinusoidal positions, optional embedding scaling, final logits bias) with an attention
    variant chosen per site and layer.

    Args:
        vocab_size (`int`, defaults to 8000): Size of the (shared) vocabulary.
        decoder_vocab_size (`int`, *optional*): Target vocabulary size when embeddings are not shared;
            defaults to `vocab_size`.
        d_model (`int`, defaults to 512): Width of the model.
        encoder_layers / decoder_layers (`int`, defaults to 6): Number of layers.
        encoder_attention_heads / decoder_attention_heads (`int`, defaults to 8): Heads per attention; must
            divide `d_model`.
        encoder_ffn_dim / decoder_ffn_dim (`int`, defaults to 2048): Inner size of the feed-forward blocks.
        activation_function (`str`, defaults to `"swish"`): Any name in `transformers.activations.ACT2FN`.
        dropout (`float`, defaults to 0.1): Dropout on embeddings and residual branches.
        attention_dropout (`float`, defaults to 0.0): Dropout on attention probabilities.
        activation_dropout (`float`, defaults to 0.0): Dropout after the feed-forward activation.
        encoder_layerdrop / decoder_layerdrop (`float`, defaults to 0.0): LayerDrop probabilities.
        max_position_embeddings (`int`, defaults to 512): Longest sequence the position table covers.
        position_embedding (`str`, defaults to `"sinusoidal"`): `"sinusoidal"` (Marian's table) or `"none"`.
        scale_embedding (`bool`, defaults to `True`): Multiply token embeddings by sqrt(d_model).
        share_encoder_decoder_embeddings (`bool`, defaults to `True`): One embedding matrix for both sides.
        tie_word_embeddings (`bool`, defaults to `True`): Tie the output projection to the decoder embeddings.
        init_std (`float`, defaults to 0.02): Standard deviation of the weight initialisation.
        label_smoothing (`float`, defaults to 0.0): Label smoothing of the model's own cross-entropy loss.
        pad_token_id / eos_token_id / decoder_start_token_id (`int`, defaults to 0 / 1 / 0): Special token ids
            (Marian starts decoding from the pad token).
        encoder_self_attention / decoder_self_attention / cross_attention (`str`, `dict` or `list[dict]`,
            defaults to `"softmax"`): The attention variant at each site. A name uses that variant at its
            default layers (every layer, except for variants whose paper places them elsewhere: `dhicm` goes
            to the last layer); a dict `{"type": name, "layers": [...], **options}` uses it at the listed
            layers (negative indices count from the top) and softmax elsewhere; a list of such dicts places
            several variants at disjoint layers.
        pruned_heads (`dict[str, list[int]]`, *optional*): Heads removed from attention modules, as module name
            (`"encoder.layers.5.self_attn"`, `"decoder.layers.5.self_attn"`, `"decoder.layers.5.encoder_attn"`)
            -> indices of the removed heads among the site's original heads. Set by
            `HeadAttnPreTrainedModel.prune_heads`; the pruned modules are built with smaller projections.
        fertility (`str`, defaults to `"constant"`): How the constrained cross-attention variants (`csoftmax`,
            `csparsemax`) bound the attention each source token receives (Malaviya et al., 2018, Sec. 4):
            `"constant"` (every token gets `constant_fertility`), `"guided"` (per token id, the largest fertility
            seen in word alignments of the training data, kept in the model; see
            `hf_headattn.alignment.guided_fertility_table`) or `"predicted"` (a bi-LSTM tagger inside the model,
            trained on those fertilities; see `hf_headattn.alignment.train_fertility_predictor`).
        constant_fertility (`float`, defaults to 2.0): The fertility of every token with `"constant"`.
        fertility_predictor_size (`int`, defaults to 128): Embedding and hidden size of the `"predicted"` tagger.
        max_fertility (`int`, defaults to 10): The largest fertility the `"predicted"` tagger can output.
        guided_alignment_weight (`float`, defaults to 0.0): Guided alignment (Garg et al., 2019): the weight of the
            cost between the guided heads' cross-attention and a word aligner's links (`alignment_links`) in the
            loss; 0 for a model trained without guidance (Garg et al. use 0.05). See `guided_alignment.py`.
        guided_alignment_cost (`str`, defaults to `"ce"`): `"ce"` (Garg et al.'s cross-entropy, reported as
            KL(links || attention)), `"mse"` (squared error) or `"mult"` (minus the log of the attention on linked
            tokens), as in Marian's `--guided-alignment-cost`.
        guided_alignment_layer (`int`, *optional*): The decoder layer whose cross-attention is guided (negative
            counts from the top); by default the penultimate (Garg et al.'s), the only one of a one-layer decoder.
            With a weight > 0, `--alignments` reads this layer by default.
        guided_alignment_heads (`list[int]`, defaults to `[0]`): The guided heads of that layer (original indices),
            whose mean attention is compared with the links; `--alignments` averages these by default.
    """

    model_type = "headattn"
    keys_to_ignore_at_inference = [CACHE_NAME]
    attribute_map = {
        "num_attention_heads": "encoder_attention_heads",
        "hidden_size": "d_model",
        # Transformers sizes the decoding cache from num_hidden_layers; its layers are the decoder's.
        "num_hidden_layers": "decoder_layers",
    }

    def __init__(
        self,
        vocab_size: int = 8000,
        decoder_vocab_size: int | None = None,
        d_model: int = 512,
        encoder_layers: int = 6,
        decoder_layers: int = 6,
        encoder_attention_heads: int = 8,
        decoder_attention_heads: int = 8,
        encoder_ffn_dim: int = 2048,
        decoder_ffn_dim: int = 2048,
        activation_function: str = "swish",
        dropout: float = 0.1,
        attention_dropout: float = 0.0,
        activation_dropout: float = 0.0,
        encoder_layerdrop: float = 0.0,
        decoder_layerdrop: float = 0.0,
        max_position_embeddings: int = 512,
        position_embedding: str = "sinusoidal",
        scale_embedding: bool = True,
        share_encoder_decoder_embeddings: bool = True,
        tie_word_embeddings: bool = True,
        init_std: float = 0.02,
        label_smoothing: float = 0.0,
        use_cache: bool = True,
        pad_token_id: int = 0,
        eos_token_id: int = 1,
        decoder_start_token_id: int = 0,
        encoder_self_attention: str | dict | list = "softmax",
        decoder_self_attention: str | dict | list = "softmax",
        cross_attention: str | dict | list = "softmax",
        pruned_heads: dict[str, list[int]] | None = None,
        fertility: str = "constant",
        constant_fertility: float = 2.0,
        fertility_predictor_size: int = 128,
        max_fertility: int = 10,
        guided_alignment_weight: float = 0.0,
        guided_alignment_cost: str = "ce",
        guided_alignment_layer: int | None = None,
        guided_alignment_heads: list[int] | None = None,
        **kwargs,
    ):
        self.vocab_size = vocab_size
        self.decoder_vocab_size = decoder_vocab_size if decoder_vocab_size is not None else vocab_size
        self.d_model = d_model
        self.encoder_layers = encoder_layers
        self.decoder_layers = decoder_layers
        self.encoder_attention_heads = encoder_attention_heads
        self.decoder_attention_heads = decoder_attention_heads
        self.encoder_ffn_dim = encoder_ffn_dim
        self.decoder_ffn_dim = decoder_ffn_dim
        self.activation_function = activation_function
        self.dropout = dropout
        self.attention_dropout = attention_dropout
        self.activation_dropout = activation_dropout
        self.encoder_layerdrop = encoder_layerdrop
        self.decoder_layerdrop = decoder_layerdrop
        self.max_position_embeddings = max_position_embeddings
        self.position_embedding = position_embedding
        self.scale_embedding = scale_embedding
        self.share_encoder_decoder_embeddings = share_encoder_decoder_embeddings
        self.init_std = init_std
        self.label_smoothing = label_smoothing
        self.use_cache = use_cache
        self.encoder_self_attention = encoder_self_attention
        self.decoder_self_attention = decoder_self_attention
        self.cross_attention = cross_attention
        self.fertility = fertility
        self.constant_fertility = constant_fertility
        self.fertility_predictor_size = fertility_predictor_size
        self.max_fertility = max_fertility
        self.guided_alignment_weight = guided_alignment_weight
        self.guided_alignment_cost = guided_alignment_cost
        self.guided_alignment_layer = guided_alignment_layer
        self.guided_alignment_heads = list(guided_alignment_heads if guided_alignment_heads is not None
                                           else DEFAULT_GUIDED_HEADS)
        kwargs.setdefault("auto_map", dict(AUTO_MAP))
        kwargs.setdefault("custom_pipelines", dict(CUSTOM_PIPELINES))
        kwargs.setdefault("is_encoder_decoder", True)
        super().__init__(
            pad_token_id=pad_token_id,
            eos_token_id=eos_token_id,
            decoder_start_token_id=decoder_start_token_id,
            tie_word_embeddings=tie_word_embeddings,
            **kwargs,
        )
        # after the base __init__, which on Transformers 4.x resets its own `pruned_heads` (then keyed by layer index)
        self.pruned_heads = {name: sorted(heads) for name, heads in (pruned_heads or {}).items()}
        self.validate_architecture()

    @classmethod
    def from_dict(cls, config_dict: dict[str, Any], **kwargs):
        # Transformers 4.x's from_dict casts `pruned_heads` keys to int (its keys were layer indices); ours are module
        # names, so they bypass it
        check_model_type(cls, config_dict)
        config_dict = dict(config_dict)
        pruned_heads = config_dict.pop("pruned_heads", None)
        loaded = super().from_dict(config_dict, **kwargs)
        config = loaded[0] if isinstance(loaded, tuple) else loaded
        if pruned_heads:
            config.pruned_heads = {name: sorted(heads) for name, heads in pruned_heads.items()}
            config.validate_architecture()
        return loaded

    def save_pretrained(self, save_directory, *args, **kwargs):
        """Save config.json and this module's code (see `remote_code`), checked complete before anything is
        written."""
        self.validate_architecture()  # Transformers 5 runs it through `validate`; 4.57 does not
        check_code_travels(type(self))
        super().save_pretrained(save_directory, *args, **kwargs)

    def validate_architecture(self) -> None:
        """Raise ValueError, naming the bad value and what would be accepted, for any inconsistent field (also
        run by `save_pretrained`, through `PreTrainedConfig.validate`)."""
        validate_base_architecture(super())
        self._check_architecture()
        self._check_pruned_heads()
        for site in SITES:
            self._resolve_site(site)
        self._check_guided_alignment()

    def _check_guided_alignment(self) -> None:
        layer = self.guided_alignment_layer
        pruned = ()
        if layer is None or (isinstance(layer, int) and not isinstance(layer, bool)
                             and -self.decoder_layers <= layer < self.decoder_layers):
            pruned = self.pruned_heads.get(self.module_name(CROSS_ATTENTION, self.guided_alignment_layer_index()), ())
        check_guided_alignment_config(self, self.decoder_layers, self.decoder_attention_heads, pruned)

    def guided_alignment_layer_index(self) -> int:
        """The guided decoder layer as an index in [0, decoder_layers): `guided_alignment_layer`, by default the
        penultimate layer (the only one of a one-layer decoder)."""
        layer = self.guided_alignment_layer
        if layer is None:
            layer = DEFAULT_GUIDED_LAYER if self.decoder_layers > 1 else -1
        return layer % self.decoder_layers

    # ----------------------------------------------------------------------------------------------- checks
    def _check_architecture(self) -> None:
        check_positive_integers(self, ("vocab_size", "decoder_vocab_size", "d_model", "encoder_layers",
                                       "decoder_layers", "encoder_attention_heads", "decoder_attention_heads",
                                       "encoder_ffn_dim", "decoder_ffn_dim", "max_position_embeddings"))
        for field in ("encoder_attention_heads", "decoder_attention_heads"):
            heads = getattr(self, field)
            if self.d_model % heads != 0:
                divisors = [h for h in range(1, self.d_model + 1) if self.d_model % h == 0 and h <= 64]
                raise ValueError(
                    f"`{field}`={heads} does not divide d_model={self.d_model}; heads that divide it: {divisors}"
                )
        check_fractions(self, ("dropout", "attention_dropout", "activation_dropout", "encoder_layerdrop",
                               "decoder_layerdrop", "label_smoothing"))
        from .attention_base import check_number

        check_number("`init_std`", self.init_std, above=0)
        check_number("`constant_fertility`", self.constant_fertility, above=0)
        # imported here: transformers.activations pulls in the hub-kernel and compile machinery (~1.4 s), which
        # `hf-headattn-train --help` (this module, not the model) has no use for
        from transformers.activations import ACT2FN

        if self.activation_function not in ACT2FN:
            raise ValueError(
                f"Unknown activation_function {self.activation_function!r}; accepted: {', '.join(sorted(ACT2FN))}"
            )
        check_fertility_config(self)
        if self.position_embedding not in POSITION_EMBEDDINGS:
            raise ValueError(
                f"Unknown position_embedding {self.position_embedding!r}; accepted: {', '.join(POSITION_EMBEDDINGS)}"
            )
        target_vocab = self.vocab_size if self.share_encoder_decoder_embeddings else self.decoder_vocab_size
        if self.share_encoder_decoder_embeddings and self.decoder_vocab_size != self.vocab_size:
            raise ValueError(
                f"decoder_vocab_size={self.decoder_vocab_size} differs from vocab_size={self.vocab_size} but "
                "share_encoder_decoder_embeddings=True; set them equal or share_encoder_decoder_embeddings=False"
            )
        check_token_ids(self, {"pad_token_id": min(self.vocab_size, target_vocab), "eos_token_id": target_vocab,
                               "decoder_start_token_id": target_vocab})

    def _num_layers(self, site: str) -> int:
        return self.encoder_layers if site == ENCODER_SELF_ATTENTION else self.decoder_layers

    def attention_heads(self, site: str) -> int:
        """Number of heads of the attention at `site` before any pruning."""
        return self.encoder_attention_heads if site == ENCODER_SELF_ATTENTION else self.decoder_attention_heads

    @staticmethod
    def module_name(site: str, layer_idx: int) -> str:
        """The attention module's name inside the encoder-decoder, as used by `pruned_heads` and in outputs."""
        stack, attention = _MODULE_NAMES[site]
        return f"{stack}.layers.{layer_idx}.{attention}"

    def attention_modules(self) -> dict[str, tuple[str, int]]:
        """Every attention module's name -> (site, layer index)."""
        return {self.module_name(site, layer): (site, layer) for site in SITES for layer in range(self._num_layers(site))}

    def kept_heads(self, site: str, layer_idx: int) -> list[int]:
        """Original indices of the heads the module at `site`, layer `layer_idx` keeps after pruning."""
        pruned = set(self.pruned_heads.get(self.module_name(site, layer_idx), ()))
        return [head for head in range(self.attention_heads(site)) if head not in pruned]

    def _check_pruned_heads(self) -> None:
        if not isinstance(self.pruned_heads, dict):
            raise ValueError(f"`pruned_heads` must be a dict module name -> head indices, got {self.pruned_heads!r}")
        modules = self.attention_modules()
        for name, heads in self.pruned_heads.items():
            if name not in modules:
                raise ValueError(
                    f"`pruned_heads` names unknown attention module {name!r}; modules look like "
                    f"'encoder.layers.0.self_attn', 'decoder.layers.0.self_attn', 'decoder.layers.0.encoder_attn' "
                    f"(this model has {self.encoder_layers} encoder and {self.decoder_layers} decoder layers)"
                )
            num_heads = self.attention_heads(modules[name][0])
            if any(not isinstance(head, int) or isinstance(head, bool) or not 0 <= head < num_heads for head in heads):
                raise ValueError(f"`pruned_heads[{name!r}]` = {heads!r}: head indices must be integers in "
                                 f"[0, {num_heads})")
            if len(set(heads)) != len(heads):
                raise ValueError(f"`pruned_heads[{name!r}]` = {heads!r} lists a head twice")
            if len(heads) >= num_heads:
                raise ValueError(f"`pruned_heads[{name!r}]` removes all {num_heads} heads; keep at least one")

    def _resolve_site(self, site: str) -> list[tuple[str, dict[str, Any]]]:
        """Validate one site's attention spec and return (variant name, options) for each of its layers."""
        spec = getattr(self, site)
        num_layers = self._num_layers(site)
        if isinstance(spec, str):
            entries = [{"type": spec}]
        elif isinstance(spec, dict):
            entries = [spec]
        elif isinstance(spec, (list, tuple)) and spec and all(isinstance(entry, dict) for entry in spec):
            entries = list(spec)
        else:
            raise ValueError(
                f"`{site}` must be a variant name, a dict {{'type': name, 'layers': [...], **options}} or a "
                f"non-empty list of such dicts; got {spec!r}"
            )
        placement: list[tuple[str, dict[str, Any]] | None] = [None] * num_layers
        for entry in entries:
            entry = dict(entry)
            if "type" not in entry:
                raise ValueError(f"`{site}` entry {entry!r} has no 'type'; registered: {', '.join(ATTENTION_VARIANTS)}")
            name = entry.pop("type")
            if name not in ATTENTION_VARIANTS:
                raise ValueError(
                    f"Unknown attention variant {name!r} for `{site}`; registered variants are: "
                    f"{', '.join(sorted(ATTENTION_VARIANTS))}"
                )
            variant = get_attention_variant(name)
            if site not in variant.sites:
                raise ValueError(
                    f"Attention variant {name!r} cannot be used at `{site}`; it supports: {', '.join(variant.sites)}"
                )
            layers = entry.pop("layers", variant.default_layers)
            unknown = sorted(set(entry) - set(variant.options))
            if unknown:
                accepted = ", ".join(sorted(variant.options)) or "none"
                raise ValueError(
                    f"Attention variant {name!r} at `{site}` does not take option(s) {', '.join(unknown)}; "
                    f"accepted options: {accepted} (plus 'layers')"
                )
            resolved_layers = self._resolve_layers(site, layers, num_layers)
            for layer in resolved_layers:
                if placement[layer] is not None:
                    raise ValueError(f"Layer {layer} of `{site}` is given more than one attention variant")
                if not variant.prunable and self.module_name(site, layer) in self.pruned_heads:
                    raise ValueError(
                        f"Attention variant {name!r} ties each head to its index, so its heads cannot be pruned; "
                        f"remove {self.module_name(site, layer)!r} from `pruned_heads`"
                    )
                placement[layer] = (name, entry)
            for num_heads in sorted({len(self.kept_heads(site, layer)) for layer in resolved_layers}):
                variant.check_options(entry, site=site, num_heads=num_heads, config=self)
        return [chosen if chosen is not None else ("softmax", {}) for chosen in placement]

    @staticmethod
    def _resolve_layers(site: str, layers, num_layers: int) -> list[int]:
        if layers is None:
            return list(range(num_layers))
        if isinstance(layers, int) and not isinstance(layers, bool):
            layers = [layers]
        if not isinstance(layers, (list, tuple)) or not layers:
            raise ValueError(f"`layers` of `{site}` must be a non-empty list of layer indices, got {layers!r}")
        resolved = []
        for layer in layers:
            if not isinstance(layer, int) or isinstance(layer, bool) or not -num_layers <= layer < num_layers:
                raise ValueError(
                    f"Layer index {layer!r} of `{site}` is out of range; this site has {num_layers} layers, so "
                    f"indices in [{-num_layers}, {num_layers - 1}] are accepted"
                )
            resolved.append(layer % num_layers)
        if len(set(resolved)) != len(resolved):
            raise ValueError(f"`layers` of `{site}` lists a layer twice: {layers!r}")
        return resolved

    # ----------------------------------------------------------------------------------------------- queries
    def uses_fertility(self) -> bool:
        """Whether any cross-attention layer's variant bounds attention by source-token fertility."""
        return any(get_attention_variant(name).needs_fertility for name, _ in self._resolve_site(CROSS_ATTENTION))

    def attention_variant(self, site: str, layer_idx: int) -> tuple[str, dict[str, Any]]:
        """The (variant name, options) used at `site` in layer `layer_idx`."""
        if site not in SITES:
            raise ValueError(f"Unknown attention site {site!r}; sites are: {', '.join(SITES)}")
        return self._resolve_site(site)[layer_idx]

    # ------------------------------------------------------------------------ what the tooling asks of the family
    # Both families' configs answer these, so that cards, the web page, plots and the commands never test a model
    # type or name a variant.
    family = "transformer"  # the model card template (model_cards/<family>.md) and the family's tag

    def attention_variant_names(self) -> list[str]:
        """The registered variants the model uses, at any site and layer, sorted."""
        return sorted({self.attention_variant(site, layer)[0] for site in SITES
                       for layer in range(self._num_layers(site))})

    def papers(self) -> list[str]:
        """The citations a model card lists: the Transformer's, then each variant's paper, once each."""
        variant_papers = (ATTENTION_VARIANTS[name].paper for name in self.attention_variant_names())
        return list(dict.fromkeys([TRANSFORMER_PAPER, *(paper for paper in variant_papers if paper)]))

    def card_tags(self) -> list[str]:
        """The family's own Hub tags (the variants' names are tagged by the card)."""
        return []

    def describe(self) -> str:
        """One line saying which attention the model uses where (the web page's model description)."""
        parts = []
        for site in SITES:
            names = [self.attention_variant(site, layer)[0] for layer in range(self._num_layers(site))]
            shown = names[0] if len(set(names)) == 1 else f"{' / '.join(names)} (by layer)"
            parts.append(f"{_SITE_TITLES[site].lower()}: {shown}")
        fertility = f"; fertility {self.fertility}" if self.uses_fertility() else ""
        return f"Transformer, {self.decoder_layers} decoder layers; " + "; ".join(parts) + fertility

    def describe_architecture(self) -> list[str]:
        """The architecture in sentences, for the model card (the card adds the parameter count to the first)."""
        encoder_heads, decoder_heads = self.encoder_attention_heads, self.decoder_attention_heads
        heads = (f"{encoder_heads} heads" if encoder_heads == decoder_heads
                 else f"{encoder_heads} encoder / {decoder_heads} decoder heads")
        lines = [
            f"Transformer: {self.encoder_layers} encoder and {self.decoder_layers} decoder layers, d_model "
            f"{self.d_model}, {heads}, feed-forward {self.encoder_ffn_dim}, {self.position_embedding} position "
            f"embeddings, vocabulary {self.vocab_size:,}",
            *(f"{title}: {self._describe_site(site)}." for site, title in _SITE_TITLES.items()),
        ]
        if self.uses_fertility():
            lines.append(f"Fertility of the constrained cross-attention: {describe_fertility(self)}.")
        if self.pruned_heads:
            pruned = "; ".join(f"{name}: heads {', '.join(map(str, removed))}"
                               for name, removed in self.pruned_heads.items())
            lines.append(f"Pruned heads (indices among each module's original heads): {pruned}.")
        return lines

    def _describe_site(self, site: str) -> str:
        """e.g. "`softmax` in layers 0-4, `dhicm` (kl_weight=0.1) in layer 5", from the resolved per-layer specs."""
        placements: dict[str, list[int]] = {}
        for layer in range(self._num_layers(site)):
            name, options = self.attention_variant(site, layer)
            label = f"`{name}`" + (f" ({', '.join(f'{k}={v}' for k, v in sorted(options.items()))})" if options else "")
            placements.setdefault(label, []).append(layer)
        if len(placements) == 1:
            return f"{next(iter(placements))} in every layer"
        return ", ".join(f"{label} in {_layer_ranges(layers)}" for label, layers in placements.items())

    @property
    def cross_attention_layers(self) -> int:
        """How many cross-attention layers the model returns (`outputs.cross_attentions`)."""
        return self.decoder_layers

    def cross_attention_module(self, layer_idx: int) -> str:
        """The name of the cross-attention module of decoder layer `layer_idx` (as `pruned_heads` names it)."""
        return self.module_name(CROSS_ATTENTION, layer_idx)

    def cross_attention_variant(self, layer_idx: int) -> tuple[str, dict[str, Any]]:
        """The (variant name, options) of the cross-attention of decoder layer `layer_idx`."""
        return self.attention_variant(CROSS_ATTENTION, layer_idx)

    def cross_attention_heads(self, layer_idx: int) -> list[int]:
        """Original indices of the heads the cross-attention of decoder layer `layer_idx` keeps."""
        return self.kept_heads(CROSS_ATTENTION, layer_idx)

    def cross_attention_label(self, layer_idx: int) -> str:
        """What the web page and the plots call the cross-attention of decoder layer `layer_idx`."""
        return f"layer {layer_idx + 1}"

    def guided_alignment(self) -> tuple[int, list[int]] | None:
        """(decoder layer index, original head indices) of the cross-attention trained with guided alignment, which
        `--alignments` reads by default; None for a model trained without it (`guided_alignment_weight` 0)."""
        if not self.guided_alignment_weight:
            return None
        return self.guided_alignment_layer_index(), list(self.guided_alignment_heads)

    def constrained_cross_attention(self, layer_idx: int) -> bool | None:
        """None when the cross-attention of decoder layer `layer_idx` is not bounded by fertilities; else whether a
        sink takes the attention the bounds leave over."""
        name, options = self.cross_attention_variant(layer_idx)
        if not ATTENTION_VARIANTS[name].needs_fertility:
            return None
        return bool(options.get("sink", True))

    def head_weighting_modules(self) -> dict[str, str]:
        """Module name -> variant name, for the modules whose variant computes weights over their heads."""
        names = {module: self.attention_variant(site, layer)[0]
                 for module, (site, layer) in self.attention_modules().items()}
        return {module: name for module, name in names.items() if ATTENTION_VARIANTS[name].weighs_heads}


def _layer_ranges(layers: list[int]) -> str:
    spans, start = [], layers[0]
    for previous, current in zip(layers, layers[1:] + [None]):
        if current != previous + 1:
            spans.append(str(start) if start == previous else f"{start}-{previous}")
            start = current
    return ("layer " if len(layers) == 1 else "layers ") + ", ".join(spans)


# save_pretrained copies this module and its relative imports, and names it in config.json's auto_map
HeadAttnConfig.register_for_auto_class()


__all__ = ["HeadAttnConfig"]
