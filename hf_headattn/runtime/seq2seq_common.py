"""What both model families share around their forwards: the teacher-forcing inputs (`shift_tokens_right`), the loss
(`seq2seq_loss`), the input checks (`check_seq2seq_inputs`, run once per outer call through `checks_inputs`,
`check_generate_inputs` and `inputs_checked_by_caller`) and the check of `generate`'s counts
(`check_generation_counts`)."""

import contextlib
import contextvars
import functools
import inspect
import numbers
from pathlib import Path

import torch
from torch import nn
from transformers.cache_utils import Cache


# what a cut-short or damaged weights file raises as Transformers reads it: safetensors' error (whose class is named
# so, not imported here: the runtime imports only torch and Transformers) and PyTorch's zip reader
WEIGHTS_READ_ERRORS = ("SafetensorError", "PytorchStreamReader", "unexpected EOF", "invalid load key")


def damaged_weights_message(name_or_path, error: BaseException) -> str | None:
    """What to tell a user whose `from_pretrained(name_or_path)` failed reading the weights with `error`: which file,
    that it is cut short or damaged, and how to get it whole again; None for any other error."""
    text = f"{type(error).__name__}: {error}"
    if not any(marker in text for marker in WEIGHTS_READ_ERRORS):
        return None
    folder = Path(str(name_or_path))
    named = [folder / name for name in ("model.safetensors", "pytorch_model.bin") if (folder / name).is_file()]
    where = str(named[0]) if named else f"the weights file of {name_or_path}"
    fix = ("copy or save the folder again" if folder.is_dir() else
           f"download it again: huggingface_hub.snapshot_download({str(name_or_path)!r}, force_download=True), or "
           "delete the model from the Hugging Face cache (`hf cache delete`)")
    return (f"{where} cannot be read ({text}): it is cut short or damaged, as an interrupted download or copy leaves "
            f"it; {fix}")


class NamesDamagedWeights:
    """`from_pretrained` that names a weights file it cannot read, and how to get it whole again, instead of the
    reader's bare error (safetensors' "incomplete metadata"), for whoever loads the model, with or without this
    package (`trust_remote_code`)."""

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path, *model_args, **kwargs):
        try:
            return super().from_pretrained(pretrained_model_name_or_path, *model_args, **kwargs)
        except Exception as error:
            message = damaged_weights_message(pretrained_model_name_or_path, error)
            if message is None:
                raise
            raise OSError(message) from error


def shift_tokens_right(labels: torch.Tensor, pad_token_id: int, decoder_start_token_id: int) -> torch.Tensor:
    """Decoder inputs for teacher forcing: labels shifted right behind the start token, -100 replaced by pad."""
    shifted = labels.new_zeros(labels.shape)
    shifted[:, 1:] = labels[:, :-1].clone()
    shifted[:, 0] = decoder_start_token_id
    shifted.masked_fill_(shifted == -100, pad_token_id)
    return shifted


def seq2seq_loss(logits, labels, label_smoothing, aux_loss=None, num_items_in_batch=None):
    """(cross-entropy, total loss): label-smoothed CE summed over this batch's label tokens, divided by the tokens
    of the whole optimizer step; the auxiliary loss (this batch's per-target-token average) is weighted by the
    batch's share of those tokens, which makes it a sum over target tokens divided by the same count."""
    labels = labels.to(logits.device)
    batch_tokens = labels.ne(-100).sum()
    ce_sum = nn.functional.cross_entropy(
        logits.float().reshape(-1, logits.shape[-1]),
        labels.reshape(-1),
        ignore_index=-100,
        reduction="sum",
        label_smoothing=label_smoothing,
    )
    denominator = batch_tokens.clamp(min=1) if num_items_in_batch is None else num_items_in_batch
    if torch.is_tensor(denominator):
        denominator = denominator.to(ce_sum.device)
    ce_loss = ce_sum / denominator
    if aux_loss is None:
        return ce_loss, ce_loss
    share = 1.0 if num_items_in_batch is None else batch_tokens / denominator
    return ce_loss, ce_loss + share * aux_loss


# ------------------------------------------------------------------------------------------------ input checks
# Set while an outer call (the language model's forward around the bare model's, `generate` around its decoding
# steps) has already checked the inputs, so that inner forwards do not check (and sync on) them again.
_INPUTS_CHECKED_BY_CALLER = contextvars.ContextVar("hf_headattn_inputs_checked_by_caller", default=False)
ID_DTYPES = (torch.int64, torch.int32)  # what nn.Embedding indexes with; labels must be int64 (cross_entropy)
IGNORED_LABEL = -100


def inputs_checked_elsewhere() -> bool:
    """True inside a call whose inputs an outer call checked, and while compiling, exporting or tracing: the checks
    read tensor values, which would put data-dependent branches into a graph."""
    return (torch.compiler.is_compiling() or torch.compiler.is_exporting() or torch.jit.is_tracing()
            or torch.jit.is_scripting() or _INPUTS_CHECKED_BY_CALLER.get())


@contextlib.contextmanager
def inputs_checked_by_caller():
    """Within the block, the models' forwards trust their inputs (an outer call checked them)."""
    token = _INPUTS_CHECKED_BY_CALLER.set(True)
    try:
        yield
    finally:
        _INPUTS_CHECKED_BY_CALLER.reset(token)


def checks_inputs(forward):
    """Decorate a model's `forward` so that it checks its arguments (`self.check_inputs(**arguments)`) before any
    work, unless an outer call already did (then the check costs one ContextVar read)."""
    signature = inspect.signature(forward)

    @functools.wraps(forward)
    def checked_forward(self, *args, **kwargs):
        if inputs_checked_elsewhere():
            return forward(self, *args, **kwargs)
        arguments = signature.bind(self, *args, **kwargs).arguments
        arguments.pop("self")
        arguments.update(arguments.pop("kwargs", {}))
        self.check_inputs(**arguments)
        with inputs_checked_by_caller():
            return forward(self, *args, **kwargs)

    return checked_forward


def check_generate_inputs(model, inputs, kwargs: dict) -> None:
    """`model.check_inputs` on what `generate(inputs, **kwargs)` was given (its first argument is the source ids).
    Without any source, `generate` is left to answer as it answers MarianMTModel: a source of one BOS token when
    `bos_token_id` is set, else its error asking for it."""
    if inputs_checked_elsewhere():
        return
    if inputs is None and all(kwargs.get(name) is None for name in ("input_ids", "inputs_embeds", "encoder_outputs")):
        return
    arguments = {name: kwargs.get(name) for name in ("input_ids", "attention_mask", "inputs_embeds", "decoder_input_ids",
                                                     "decoder_attention_mask", "encoder_outputs")}
    if inputs is not None:
        arguments["input_ids"] = inputs
    model.check_inputs(**arguments)


# generate's counts, and what each means: Transformers (5.24 included) divides by `num_beams` and sizes tensors by
# both, so 0 or a negative count fails deep inside (ZeroDivisionError, a negative dimension), and returning 0
# sequences silently returns one
GENERATION_COUNTS = {
    "num_beams": "1: greedy search or sampling; more: beam search",
    "num_return_sequences": "sequences returned per input, at most num_beams",
}


def check_generation_counts(generation_config, kwargs: dict) -> None:
    """Refuse (ValueError naming the argument, its value and what is accepted) a `num_beams` or
    `num_return_sequences` that is not a whole number >= 1, as given to `generate` (or the pipeline) in `kwargs`,
    else as set in the call's `generation_config=`, else in `generation_config` (the model's)."""
    config = kwargs.get("generation_config") or generation_config
    for name, meaning in GENERATION_COUNTS.items():
        value = kwargs[name] if kwargs.get(name) is not None else getattr(config, name, None)
        if value is not None and (isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1):
            raise ValueError(f"`{name}` must be a whole number >= 1 ({meaning}), got {value!r}")


def _describe(tensor: torch.Tensor) -> str:
    return f"shape {tuple(tensor.shape)}, dtype {tensor.dtype}"


def _require_tensor(name: str, value, what: str) -> torch.Tensor:
    if not torch.is_tensor(value):
        raise ValueError(f"`{name}` must be a torch.Tensor of {what}, got {type(value).__name__}")
    return value


def _check_id_structure(name: str, ids, dtypes=ID_DTYPES) -> torch.Tensor:
    _require_tensor(name, ids, "token ids [batch, length]")
    if ids.dim() != 2:
        raise ValueError(f"`{name}` must be 2-D token ids [batch, length], got {_describe(ids)}"
                         + (" (a single sentence needs a batch dimension: ids[None])" if ids.dim() == 1 else ""))
    if ids.dtype not in dtypes:
        raise ValueError(f"`{name}` must hold integer token ids of dtype {' or '.join(map(str, dtypes))}, got "
                         f"{_describe(ids)}")
    if ids.shape[0] == 0 or ids.shape[1] == 0:
        raise ValueError(f"`{name}` is empty ({_describe(ids)}): it needs at least one sentence of at least one "
                         "token (an empty sentence is its EOS token alone)")
    return ids


def _check_embeds_structure(name: str, embeds, width: int) -> torch.Tensor:
    _require_tensor(name, embeds, f"embeddings [batch, length, {width}]")
    if embeds.dim() != 3 or embeds.shape[-1] != width or not embeds.is_floating_point():
        raise ValueError(f"`{name}` must be floating-point embeddings [batch, length, {width}] (the model width), "
                         f"got {_describe(embeds)}")
    if embeds.shape[0] == 0 or embeds.shape[1] == 0:
        raise ValueError(f"`{name}` is empty ({_describe(embeds)}): it needs at least one sentence of one position")
    return embeds


def _check_mask_structure(name: str, mask, shape: tuple, shape_of: str) -> torch.Tensor:
    _require_tensor(name, mask, "0/1 values")
    if mask.is_complex():
        raise ValueError(f"`{name}` must hold 0/1 values (bool or integer), got {_describe(mask)}")
    if tuple(mask.shape) != tuple(shape):
        raise ValueError(f"`{name}` has shape {tuple(mask.shape)}; it must match {shape_of} {tuple(shape)}")
    return mask


def check_seq2seq_inputs(
    *,
    source_vocab_size: int,
    target_vocab_size: int,
    label_vocab_size: int,
    width: int | None,
    input_ids=None,
    attention_mask=None,
    inputs_embeds=None,
    decoder_input_ids=None,
    decoder_attention_mask=None,
    decoder_inputs_embeds=None,
    labels=None,
    encoder_outputs=None,
    cache=None,
    **_other_arguments,
) -> None:
    """Raise ValueError, naming the argument, its shape/dtype/values and what is accepted, unless the inputs of an
    encoder-decoder forward or `generate` are usable: 2-D integer ids inside the vocabularies (labels may hold
    -100), masks of 0/1 (bool, integer, or float 0.0/1.0) with the shape of what they mask, decoder inputs and labels
    of one shape and the source's batch, non-empty sources, embeddings 3-D with the model `width` (None: the model
    takes no embeddings). Shape and dtype checks are free; the value checks cost one reduction per tensor and a
    single host sync for all of them together, and a decoding step that continues a `cache` holding positions skips
    them (see below). Both model families call it, through `checks_inputs`."""
    source_shape, source_of = _source_shape(input_ids, inputs_embeds, encoder_outputs, width)
    if attention_mask is not None:
        _check_mask_structure("attention_mask", attention_mask, source_shape, source_of)
    target_shape, target_of = _target_shape(decoder_input_ids, decoder_inputs_embeds, labels, width)
    if target_shape is not None and target_shape[0] != source_shape[0]:
        raise ValueError(f"{target_of} has batch size {target_shape[0]} but the source has {source_shape[0]} "
                         f"({source_of} {source_shape}): one target per source sentence")
    past_length = cache.get_seq_length() if isinstance(cache, Cache) else 0  # (a Python int: no sync)
    if decoder_attention_mask is not None and target_shape is not None:
        expected = (target_shape[0], past_length + target_shape[1])
        cached = f" after {past_length} cached positions" if past_length else ""
        _check_mask_structure("decoder_attention_mask", decoder_attention_mask, expected,
                              f"{target_of}{cached}, [batch, cached + new positions] =")

    # Values: one reduction each, then one host sync for all of them; not in a decoding step that continues a cache.
    # A decoding loop's first step (no cache yet) checks the source and mask that the later steps pass again, and the
    # later steps' ids are the loop's own predictions; on a GPU, reading values at every step would stall the host at
    # every token (tests/test_host_sync.py).
    if past_length:
        return
    id_checks = [(name, ids, vocab) for name, ids, vocab in (
        ("input_ids", input_ids if encoder_outputs is None else None, source_vocab_size),
        ("decoder_input_ids", decoder_input_ids, target_vocab_size),
        ("labels", labels, label_vocab_size),
    ) if ids is not None]
    mask_checks = [(name, mask) for name, mask in (("attention_mask", attention_mask),
                                                    ("decoder_attention_mask", decoder_attention_mask))
                   if mask is not None and mask.dtype != torch.bool]
    _check_values(id_checks, mask_checks)


def _source_shape(input_ids, inputs_embeds, encoder_outputs, width: int | None) -> tuple[tuple, str]:
    """The source's [batch, length] and what it was read from (for messages): the encoder states when given, else
    the ids or embeddings (only one of them), structure checked."""
    if encoder_outputs is not None:
        encoder_states = encoder_outputs[0] if isinstance(encoder_outputs, (tuple, list)) else encoder_outputs.last_hidden_state
        return tuple(encoder_states.shape[:2]), "the encoder states `encoder_outputs[0]`"
    if input_ids is not None and inputs_embeds is not None:
        raise ValueError("Pass either `input_ids` or `inputs_embeds`, not both")
    if input_ids is not None:
        return tuple(_check_id_structure("input_ids", input_ids).shape), "`input_ids`"
    if inputs_embeds is not None:
        if width is None:
            raise ValueError("This model reads token ids: pass `input_ids`, not `inputs_embeds`")
        return (tuple(_check_embeds_structure("inputs_embeds", inputs_embeds, width).shape[:2]),
                "`inputs_embeds`' [batch, length]")
    raise ValueError("Pass the source: `input_ids` [batch, length] (or `inputs_embeds`, or `encoder_outputs`)")


def _target_shape(decoder_input_ids, decoder_inputs_embeds, labels, width: int | None) -> tuple[tuple | None, str | None]:
    """The target's [batch, length] and what it was read from (for messages), or (None, None) without one: the
    decoder ids or embeddings (only one of them), else the labels, structure checked and of one shape."""
    target_shape = target_of = None
    if decoder_input_ids is not None and decoder_inputs_embeds is not None:
        raise ValueError("Pass either `decoder_input_ids` or `decoder_inputs_embeds`, not both")
    if decoder_input_ids is not None:
        target_shape, target_of = tuple(_check_id_structure("decoder_input_ids", decoder_input_ids).shape), "`decoder_input_ids`"
    elif decoder_inputs_embeds is not None:
        if width is None:
            raise ValueError("This model reads token ids: pass `decoder_input_ids`, not `decoder_inputs_embeds`")
        target_shape = tuple(_check_embeds_structure("decoder_inputs_embeds", decoder_inputs_embeds, width).shape[:2])
        target_of = "`decoder_inputs_embeds`' [batch, length]"
    if labels is not None:
        label_shape = tuple(_check_id_structure("labels", labels, dtypes=(torch.int64,)).shape)
        if target_shape is not None and label_shape != target_shape:
            raise ValueError(f"`labels` has shape {label_shape}; it must match {target_of} {target_shape} (one label "
                             "per decoder position)")
        target_shape, target_of = target_shape or label_shape, target_of or "`labels`"
    return target_shape, target_of


def _check_values(id_checks: list[tuple], mask_checks: list[tuple]) -> None:
    """Refuse token ids outside their vocabulary (labels may hold IGNORED_LABEL) and non-bool masks holding other
    values than 0 and 1: `id_checks` of (name, ids, vocabulary size), `mask_checks` of (name, mask). One reduction
    per tensor, then a single host sync for all of them; the positions of a bad value are looked up only then."""
    statistics = []
    for name, ids, _ in id_checks:
        in_range = ids.masked_fill(ids == IGNORED_LABEL, 0) if name == "labels" else ids
        statistics.extend(in_range.aminmax())
    for _, mask in mask_checks:
        statistics.append(((mask != 0) & (mask != 1)).any())
    if not statistics:
        return
    values = torch.stack([statistic.to(torch.int64) for statistic in statistics]).tolist()
    for index, (name, ids, vocab) in enumerate(id_checks):
        low, high = values[2 * index], values[2 * index + 1]
        if low < 0 or high >= vocab:
            bad = ids if name != "labels" else ids.masked_fill(ids == IGNORED_LABEL, 0)
            position = tuple(((bad < 0) | (bad >= vocab)).nonzero()[0].tolist())
            ignored = f" or {IGNORED_LABEL} (ignored)" if name == "labels" else ""
            raise ValueError(f"`{name}` holds {ids[position].item()} at position {position}, outside the vocabulary: "
                             f"token ids must be in [0, {vocab}){ignored} (got values in [{low}, {high}], "
                             f"{_describe(ids)})")
    for index, (name, mask) in enumerate(mask_checks):
        if values[2 * len(id_checks) + index]:
            position = tuple(((mask != 0) & (mask != 1)).nonzero()[0].tolist())
            raise ValueError(f"`{name}` holds {mask[position].item()} at position {position}: a mask holds 0 "
                             f"(padding) or 1 (real token) only, as bool or integers ({_describe(mask)})")
