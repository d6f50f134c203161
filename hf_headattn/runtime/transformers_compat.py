"""The few places where the Transformers releases the runtime supports (4.57 and 5.x) differ, each behind one
name, so the rest of the runtime is written once against Transformers 5."""

import copy
import functools

import torch
from transformers.modeling_outputs import Seq2SeqLMOutput


try:  # Transformers 5: initialisers that leave tensors loaded from a checkpoint alone
    from transformers import initialization as init
except ImportError:  # Transformers 4 initialises before loading, so torch's own initialisers do

    class init:  # noqa: N801 (stands in for the module)
        uniform_ = staticmethod(torch.nn.init.uniform_)
        zeros_ = staticmethod(torch.nn.init.zeros_)

        @staticmethod
        @torch.no_grad()
        def copy_(tensor: torch.Tensor, other: torch.Tensor) -> torch.Tensor:
            return tensor.copy_(other)


# Transformers 5.24 renamed the decoding cache from `past_key_values` to `cache`, in model inputs and outputs alike.
CACHE_NAME = "cache" if "cache" in Seq2SeqLMOutput.__dataclass_fields__ else "past_key_values"


def with_cache(cache) -> dict:
    """`cache` as a keyword argument under this release's name: what Transformers' output classes take, and what
    `GradientCheckpointingLayer` drops when it checkpoints a layer in training."""
    return {CACHE_NAME: cache}


def cache_of(outputs):
    """The cache a Transformers output class holds, read under this release's name."""
    return getattr(outputs, CACHE_NAME)


def accepts_past_key_values(forward):
    """Decorate a `forward(..., cache=...)` so that it also takes the cache as `past_key_values`, the name that
    Transformers before 5.24 (its `generate` included) passes."""

    @functools.wraps(forward)
    def forward_taking_either_name(self, *args, past_key_values=None, **kwargs):
        if past_key_values is not None:
            if kwargs.get("cache") is not None:
                raise ValueError("Pass the decoding cache once, as `cache` (or `past_key_values`), not as both")
            kwargs["cache"] = past_key_values
        return forward(self, *args, **kwargs)

    return forward_taking_either_name


def validate_base_architecture(base) -> None:
    """`PreTrainedConfig.validate_architecture` where it exists (Transformers >= 5.4); `base` is `super()` of a
    config."""
    validate = getattr(base, "validate_architecture", None)
    if validate is not None:
        validate()


def prepare_pipeline_generate_kwargs(pipeline, generate_kwargs: dict) -> dict:
    """The `generate` keyword arguments of one pipeline call: Transformers >= 5.20 merges them with the
    pipeline's defaults in `_prepare_generate_kwargs`; before, pipelines passed their generation config unless
    the call brought its own. Here the call's generation parameters go into a copy of that config, since 5.x
    deprecates passing a config together with generation parameters."""
    prepare = getattr(pipeline, "_prepare_generate_kwargs", None)
    if prepare is not None:
        return prepare(generate_kwargs)
    if "generation_config" in generate_kwargs:
        return generate_kwargs
    generation_config = copy.deepcopy(pipeline.generation_config)
    model_kwargs = generation_config.update(**generate_kwargs)  # returns what is not a generation parameter
    if "max_length" in generate_kwargs and "max_new_tokens" not in generate_kwargs:
        generation_config.max_new_tokens = None  # the call's max_length, not the pipeline's default, bounds it
    elif generation_config.max_new_tokens is not None:
        generation_config.max_length = None  # max_new_tokens bounds it; a leftover max_length only makes generate warn
    return {**model_kwargs, "generation_config": generation_config}


def drop_cache_position(model_inputs: dict) -> dict:
    """`prepare_inputs_for_generation`'s output without `cache_position`, which Transformers 4.x adds; the runtime's
    caches know how many positions they hold. (Accepting it in `forward` instead makes 5.x warn.)"""
    model_inputs.pop("cache_position", None)
    return model_inputs
