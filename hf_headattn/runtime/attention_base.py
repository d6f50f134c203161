"""The attention seam: what every attention variant receives and returns.

A variant is the part of multi-head attention between the q/k/v projections and the residual
connection. The surrounding `HeadAttnAttention` module projects queries, keys and values, manages the
KV cache and hands the variant its per-decoding-step state; the variant computes per-head outputs
(or, if it `combines_heads`, the final output that replaces concatenation + output projection).
"""

import contextlib
import math
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch import nn

from .attention_backends import softmax_attention, to_additive  # noqa: F401  (to_additive: the variants' import)


ENCODER_SELF_ATTENTION = "encoder_self_attention"
DECODER_SELF_ATTENTION = "decoder_self_attention"
CROSS_ATTENTION = "cross_attention"
SITES = (ENCODER_SELF_ATTENTION, DECODER_SELF_ATTENTION, CROSS_ATTENTION)


class ConfigFieldError(ValueError):
    """A config's refusal of its own `fields` (the first at fault, then any it is checked against), so that code
    that sets them from its own names (the training command's flags) names its own without reading the message."""

    def __init__(self, message: str, *fields: str):
        super().__init__(message)
        self.fields = fields

    @property
    def field(self) -> str:
        return self.fields[0]

    def __reduce__(self):  # pickled (by a worker process) with its fields, which `args` does not hold
        return type(self), (str(self), *self.fields)


@contextlib.contextmanager
def config_field_at_fault(*fields: str):
    """Turn a ValueError of a check that knows no config (a variant's `check_options`) into a ConfigFieldError of
    the config's `fields`; a ConfigFieldError passes as it is."""
    try:
        yield
    except ConfigFieldError:
        raise
    except ValueError as error:
        raise ConfigFieldError(str(error), *fields) from error


def check_number(name: str, value, *, above: float | None = None, at_least: float | None = None,
                 below: float | None = None, field: str | None = None) -> None:
    """Raise ValueError naming `name` (e.g. "`init_std`" or "running_sum option `penalty`") and the value unless
    `value` is a finite real number (not a bool) with value > `above`, value >= `at_least` and value < `below`
    (each optional). NaN and infinities are refused at construction: they would only show later, as a NaN loss or
    a failed initialisation. Shared by the configs (which give the `field` at fault: a ConfigFieldError) and the
    variants' `check_options`."""
    bounds = [f"{relation} {bound}" for relation, bound in ((">", above), (">=", at_least), ("<", below))
              if bound is not None]
    accepted = " " + " and ".join(bounds) if bounds else ""
    number = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if not (number and (above is None or value > above) and (at_least is None or value >= at_least)
            and (below is None or value < below)):
        message = f"{name} must be a finite number{accepted}, got {value!r}"
        raise ConfigFieldError(message, field) if field is not None else ValueError(message)


class AttentionMask:
    """Which keys each query may attend to; built once per forward pass and shared by every layer.

    `allowed` is a bool tensor broadcastable to [batch, heads, queries, keys] (True = may attend), or None
    when every key is visible. `is_causal` is True only when `allowed` is exactly the lower triangle for
    every row (queries and keys being the same positions), so that fused kernels may use their causal fast path
    instead of the materialised mask.
    `padding` ([batch, keys], 1 = a real token, or None) and `causal` (keys after the query are hidden, cached
    positions or not) say the same as `allowed` the way flash attention takes it (see `attention_backends`).
    `fertility` ([batch, keys], cross-attention only) is each source token's attention budget, for the
    constrained variants.
    """

    def __init__(self, allowed: torch.Tensor | None, is_causal: bool = False, fertility: torch.Tensor | None = None,
                 padding: torch.Tensor | None = None, causal: bool = False):
        self.allowed = allowed
        self.is_causal = is_causal
        self.fertility = fertility
        self.padding = padding
        self.causal = causal or is_causal
        self._derived: dict = {}

    def additive(self, dtype: torch.dtype) -> torch.Tensor | None:
        """The mask as 0 / finfo(dtype).min scores; a finite minimum keeps fully masked rows free of NaN."""
        if self.allowed is None:
            return None
        return self.derived(("additive", dtype), lambda: to_additive(self.allowed, dtype))

    def derived(self, key, build):
        """A mask computed from this one, built on first use and shared by every layer of the forward pass."""
        if key not in self._derived:
            self._derived[key] = build()
        return self._derived[key]


def unrolled_length(length: int, loop: str) -> int:
    """`length`, the number of positions a Python loop runs over (`loop` names it in the error). torch.export unrolls
    such loops, so it needs their length static: refuse a symbolic one (a dynamic dimension) with a clear error
    rather than torch.export's guard failure."""
    if isinstance(length, torch.SymInt) and torch.compiler.is_exporting():
        raise RuntimeError(
            f"torch.export cannot export {loop} with a dynamic length: each position depends on the previous ones, "
            "so the positions run in a loop that the exported program unrolls. Export with that length static "
            "(dynamic batch, and dynamic lengths elsewhere, are fine)."
        )
    return length


@dataclass
class AttentionResult:
    """What a variant returns for one attention call.

    output: [batch, queries, heads, head_dim] per-head outputs, or [batch, queries, d_model] if the variant
        `combines_heads`.
    weights: [batch, heads, queries, keys] attention probabilities, when asked for (output_attentions).
    aux_loss: [batch, queries] the variant's auxiliary loss per query token, already weighted by its own
        coefficient. The model averages it over real (non-pad) tokens and adds it to the training loss; per
        token, so that the model can normalise it like the cross-entropy and gradient accumulation stays exact.
    head_kl: [batch, queries] KL(head importances || uniform) per query token, for variants that weigh heads
        (DHICM); averaged like `aux_loss` and reported as `outputs.head_kl`.
    head_importances: [batch, queries, heads] each token's importance of each head (rows sum to 1), when
        asked for (output_head_importances).
    state: the per-decoding-step state after this call; kept in the cache so that beam search reorders it.
    guided_attention: [batch, guided heads, queries, sources], set by `HeadAttnAttention` (not the variant) at the
        guided cross-attention when the model computes the guided-alignment cost (`guided_alignment.py`).
    """

    output: torch.Tensor
    weights: torch.Tensor | None = None
    aux_loss: torch.Tensor | None = None
    head_kl: torch.Tensor | None = None
    head_importances: torch.Tensor | None = None
    state: dict[str, torch.Tensor] | None = None
    guided_attention: torch.Tensor | None = None


class AttentionVariant(nn.Module):
    """Base class of attention variants.

    Subclasses set `name`, the `options` they accept (name -> default), the `sites` where they may be
    used, the layers a spec without `layers` places them at (`default_layers`, None = every layer), whether
    they `combine_heads` themselves, whether they are `stateful` (keep per-step state across decoding steps)
    whether their heads may be pruned (`prunable`: nothing in the variant is tied to a head's index) and
    whether they need the source tokens' fertilities (`needs_fertility`; the encoder then computes them), and
    which of their `nn.Linear` submodules they use by weight matrix rather than only by calling them
    (`weight_read_linears`: tools that swap linear layers, such as int8 quantization, leave those as they are).
    `kernel` says what computes their attention weights: None for softmax through Transformers' attention function
    `config._attn_implementation` (`softmax_heads`), else the name of the variant's own kernel, which runs whatever
    the implementation; `per_head_masks` marks variants that give each head its own mask (which flash attention
    cannot take). They implement `forward` and may refine `check_options`.

    What the tooling asks of a variant (model cards, the web page, the commands' `--help`, export) it answers here,
    so that a new variant is one module and one registry line: `description` (one line, for `--help` and the page),
    `paper` (the citation a model card lists, with what the model takes from it; None for plain attention),
    `weighs_heads` (it computes weights over its heads, which the page and the plots draw: `head_importances`) and
    `exportable` (Marian, hence CTranslate2, computes it: `to_marian` converts a model made only of such variants) and
    `no_attention_function` (why it is no Transformers attention function, `attention_functions.NOT_REGISTERED`; None
    for a variant that has one, `headattn_<name>` in `attention_functions.ATTENTION_FUNCTIONS`).
    """

    name: ClassVar[str]
    description: ClassVar[str]
    paper: ClassVar[str | None] = None
    weighs_heads: ClassVar[bool] = False
    exportable: ClassVar[bool] = False
    options: ClassVar[dict[str, Any]] = {}
    sites: ClassVar[tuple[str, ...]] = SITES
    default_layers: ClassVar[tuple[int, ...] | None] = None
    combines_heads: ClassVar[bool] = False
    stateful: ClassVar[bool] = False
    prunable: ClassVar[bool] = True
    needs_fertility: ClassVar[bool] = False
    weight_read_linears: ClassVar[tuple[str, ...]] = ()
    kernel: ClassVar[str | None] = None
    per_head_masks: ClassVar[bool] = False
    no_attention_function: ClassVar[str | None] = None
    # its weights can be exactly 0 (sparsemax, entmax, the constrained variants): guided alignment then compares the
    # links with the softmax of the heads' scores q k / sqrt(d) rather than with the weights (see guided_alignment.py)
    exact_zeros: ClassVar[bool] = False

    def __init__(self, config, site: str, layer_idx: int, num_heads: int, head_dim: int, **options):
        """num_heads: the heads this module has (fewer than the site's when some were pruned); head_dim: the
        size of each head (d_model / the site's head count, unchanged by pruning)."""
        super().__init__()
        self.config = config
        self.site = site
        self.layer_idx = layer_idx
        self.num_heads = num_heads
        self.head_dim = head_dim
        self.scaling = head_dim**-0.5
        self.is_causal = site == DECODER_SELF_ATTENTION  # what Transformers' attention functions read of a module
        # the LSTM's source attention, which takes its normaliser from a variant, has no attention dropout
        self.attention_dropout = getattr(config, "attention_dropout", 0.0)
        resolved = {**self.options, **options}
        for option, value in resolved.items():
            setattr(self, option, value)

    @classmethod
    def check_options(cls, options: dict[str, Any], *, site: str, num_heads: int, config) -> None:
        """Raise ValueError for option values this variant cannot use (names are checked by the config)."""

    @classmethod
    def placement(cls, site: str, num_heads: int) -> str | dict[str, Any]:
        """The spec that places this variant at `site` (one of its `sites`) with `num_heads` heads: its name, or a
        dict with the options that site needs beyond the defaults. The invariant tests and the benchmarks place
        every variant by it at every site it declares (`attention_registry.every_site_placement`)."""
        return cls.name

    def softmax_heads(
        self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, attention_mask: "AttentionMask",
        output_attentions: bool, head_mask=None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Per-head softmax attention with this module's attention dropout, through the attention function
        `config._attn_implementation` names (Transformers' `AttentionInterface`; see `attention_backends`): [B, Tq, H, D]
        outputs and, if asked for, the weights (computed eagerly). head_mask: None or a mask per head (mma; see
        `attention_backends.softmax_attention`)."""
        return softmax_attention(self, query, key, value, attention_mask, head_mask=head_mask,
                                 need_weights=output_attentions)

    def cross_keys_and_values(self, key: torch.Tensor, value: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The keys and values this variant attends over at cross-attention, from the source tokens' projections
        [batch, heads, sources, head_dim]. Made once a source sentence and cached for every decoding step, so a
        variant with keys of its own (the constrained variants' <SINK>) adds them here rather than at each step. By
        default the source tokens' own."""
        return key, value

    def forward(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        attention_mask: AttentionMask,
        *,
        hidden_states: torch.Tensor,
        state: dict[str, torch.Tensor] | None = None,
        output_attentions: bool = False,
        output_head_importances: bool = False,
    ) -> AttentionResult:
        """query: [batch, heads, queries, head_dim]; key, value: [batch, heads, keys, head_dim];
        hidden_states: the un-projected query-side input [batch, queries, d_model]; state: this module's
        per-step state from the cache (None when there is no cache, i.e. start from scratch)."""
        raise NotImplementedError
