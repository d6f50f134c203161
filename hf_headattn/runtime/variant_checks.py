"""What a model's attention variants can run, checked before the model runs it: the `attn_implementation` its softmax
sites call (`check_attention_implementation`; `unknown_attention_implementation` words the error for a name no
attention function is registered under) and the decodings that roll the decoding state back
(`refuse_candidate_decoding`)."""

from transformers.utils import logging

from .attention_backends import EAGER, PADDING, SDPA, mask_format, registered_implementations
from .attention_base import SITES
from .attention_functions import ATTENTION_FUNCTIONS, NOT_REGISTERED, PREFIX
from .attention_registry import get_attention_variant
from .configuration_headattn import HeadAttnConfig


logger = logging.get_logger(__name__)


def _layers_by_variant(config: HeadAttnConfig, selected) -> str:
    """The attention modules whose variant class passes `selected`, as "`site` of layers 0, 1 (name)" phrases."""
    phrases = []
    for site in SITES:
        by_name: dict[str, list[int]] = {}
        for layer, (name, _) in enumerate(config._resolve_site(site)):
            if selected(get_attention_variant(name)):
                by_name.setdefault(name, []).append(layer)
        phrases += [f"`{site}` of layer{'s' if len(layers) > 1 else ''} {', '.join(map(str, layers))} ({name})"
                    for name, layers in by_name.items()]
    return "; ".join(phrases)


def unknown_attention_implementation(name: str) -> str:
    """The error message for an `attn_implementation` that no attention function is registered under: Transformers'
    own first sentence (every release from 4.57 on), then every name this model accepts (Transformers' own list
    names only its built-in implementations)."""
    message = (f'Specified `attn_implementation="{name}"` is not supported. Accepted: '
               f"{', '.join(registered_implementations())} (or a `kernels` hub kernel such as "
               "'kernels-community/flash-attn' on a GPU)")
    variant = name.removeprefix(PREFIX) if name.startswith(PREFIX) else None
    if name in ATTENTION_FUNCTIONS:
        message += (f". {name} is registered by register_attention_functions() (hf_headattn, or the "
                    "attention_functions module of a saved model's code)")
    elif variant in NOT_REGISTERED:
        message += (f". {variant} is no attention function: {NOT_REGISTERED[variant]}; place it per site in the "
                    f"config instead (e.g. cross_attention={variant!r})")
    return message


def check_attention_implementation(config: HeadAttnConfig, implementation: str) -> None:
    """Check that the model's variants can run under `implementation` (the attention function its softmax sites call):
    ValueError for per-head masks (mma) under flash attention, which takes one padding mask for all heads; a warning
    naming the sites whose variant has its own kernel (sparsemax, csoftmax, csparsemax, running_sum) when the
    implementation is neither eager nor sdpa: those compute their weights as they always do, whatever the
    implementation (the documented fallback)."""
    if mask_format(implementation) == PADDING:
        per_head = _layers_by_variant(config, lambda variant: variant.per_head_masks)
        if per_head:
            raise ValueError(
                f"attn_implementation={implementation!r} takes one padding mask for every head, but {per_head} gives "
                "each head its own mask (mma's global, local, forward and backward heads); use 'sdpa', 'eager' or "
                "'flex_attention' for this model"
            )
    if implementation not in (EAGER, SDPA):
        own_kernels = _layers_by_variant(config, lambda variant: variant.kernel is not None)
        if own_kernels:
            logger.warning(
                f"attn_implementation={implementation!r} runs this model's softmax attention; {own_kernels} compute "
                "their attention weights with their own kernels (not softmax), whatever the attn_implementation"
            )


def refuse_candidate_decoding(model, kwargs: dict, keeps_state: str | None = None) -> None:
    """Refuse, before any decoding, assisted and prompt-lookup decoding (`generate(assistant_model=...)`,
    `prompt_lookup_num_tokens=...`, ...) for a model with per-step decoding state: those decodings check draft tokens
    and roll the cache back to the accepted ones (`Cache.crop`), and such state (a stateful variant's running sum, a
    recurrent decoder's hidden state) has no earlier values to return to. `keeps_state` names what keeps it ("...
    keep per-step state"); by default the model's stateful attention variants, and nothing is refused without them."""
    stateful = keeps_state or _layers_by_variant(model.config, lambda variant: variant.stateful)
    if not stateful:
        return
    generation_config = kwargs.get("generation_config") or model.generation_config

    def setting(name):
        return kwargs[name] if name in kwargs else getattr(generation_config, name, None)

    # Transformers' `get_generation_mode` rule (read here without validating the settings, which generate does):
    # drafts from an assistant, the prompt, early exit or multi-token prediction, on greedy search or sampling
    drafts = (kwargs.get("assistant_model") is not None or setting("prompt_lookup_num_tokens") is not None
              or setting("assistant_early_exit") is not None or bool(setting("use_mtp")))
    if drafts and (setting("num_beams") or 1) == 1:
        raise ValueError(
            f"Assisted and prompt-lookup decoding are not available for this model: they roll the decoding state back "
            f"to the accepted draft tokens, and {stateful} keep per-step state that cannot be rolled back. Use greedy "
            "or beam search."
        )
