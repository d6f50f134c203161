"""Mixed multi-head self-attention: masks per head kind, zero new parameters, SDPA = eager, clear errors."""

import pytest
import torch

from hf_headattn import HeadAttnForConditionalGeneration
from hf_headattn.runtime.attention_mma import HEAD_KINDS
from hf_headattn.runtime.transformers_compat import cache_of

from helpers import random_model, source_batch, tiny_config


def expected_allowed(kind: str, window: int, length: int) -> torch.Tensor:
    """The masks of Eq. 8-11, written out position by position."""
    allowed = torch.zeros(length, length, dtype=torch.bool)
    for i in range(length):
        for j in range(length):
            allowed[i, j] = {
                "global": True,
                "local": i - window <= j <= i + window,
                "forward": i <= j,
                "backward": i >= j,
            }[kind]
    return allowed


@pytest.mark.parametrize("window", [1, 2, 3])
@pytest.mark.parametrize("padded", [False, True], ids=["no-padding", "padding"])
def test_each_head_attends_only_inside_its_mask(window, padded):
    kinds = ["global", "local", "forward", "backward"] * 2
    config = tiny_config(encoder_attention_heads=8, encoder_self_attention={"type": "mma", "window": window,
                                                                            "head_kinds": kinds})
    model = random_model(config)
    lengths = (9, 5, 7) if padded else (9, 9, 9)
    input_ids, attention_mask = source_batch(lengths)
    out = model(input_ids=input_ids, attention_mask=attention_mask, decoder_input_ids=input_ids[:, :3],
                output_attentions=True)
    for weights in out.encoder_attentions:
        assert torch.isfinite(weights).all()  # padded query rows included
        for row, length in enumerate(lengths):
            real = weights[row, :, :length, :]  # real query rows
            torch.testing.assert_close(real.sum(-1), torch.ones_like(real.sum(-1)))
            assert (real[..., length:] == 0).all(), "attention on padding"
            for head, kind in enumerate(kinds):
                outside = ~expected_allowed(kind, window, length)
                assert (real[head, :, :length][outside] == 0).all(), f"{kind} head attends outside its mask"
                assert (real[head, :, :length][~outside] > 0).all()


def test_default_split_is_equal_contiguous_groups():
    model = random_model(tiny_config(encoder_attention_heads=8, encoder_self_attention="mma"))
    variant = model.model.encoder.layers[0].self_attn.variant
    assert variant.head_kinds == ("global",) * 2 + ("local",) * 2 + ("forward",) * 2 + ("backward",) * 2
    assert variant.window == 1


def test_no_new_parameters():
    softmax = HeadAttnForConditionalGeneration(tiny_config())
    mma = HeadAttnForConditionalGeneration(tiny_config(
        encoder_self_attention="mma",
        decoder_self_attention={"type": "mma", "head_kinds": ["global", "local", "backward", "backward"]},
    ))
    assert {k: v.shape for k, v in mma.state_dict().items()} == {k: v.shape for k, v in softmax.state_dict().items()}


def test_sdpa_and_eager_agree():
    spec = dict(encoder_self_attention={"type": "mma", "window": 2},
                decoder_self_attention={"type": "mma", "head_kinds": ["local", "global", "backward", "local"]})
    sdpa = random_model(tiny_config(**spec))
    eager = HeadAttnForConditionalGeneration(tiny_config(attn_implementation="eager", **spec)).eval()
    eager.load_state_dict(sdpa.state_dict())
    input_ids, attention_mask = source_batch((9, 5, 7))
    kwargs = dict(input_ids=input_ids, attention_mask=attention_mask, decoder_input_ids=input_ids[:, :6])
    with torch.no_grad():
        torch.testing.assert_close(sdpa(**kwargs).logits, eager(**kwargs).logits, atol=1e-5, rtol=1e-5)


def test_decoder_mma_masks_hold_in_cached_decoding():
    """Step-by-step decoding (query at an offset into the cached keys) reproduces the full pass."""
    model = random_model(tiny_config(decoder_self_attention={"type": "mma", "window": 1,
                                                             "head_kinds": ["local", "local", "backward", "global"]}))
    input_ids, attention_mask = source_batch()
    decoder_input_ids = torch.randint(2, 64, (3, 6), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        full = model(input_ids=input_ids, attention_mask=attention_mask, decoder_input_ids=decoder_input_ids).logits
        cache, steps = None, []
        for t in range(6):
            out = model(input_ids=input_ids, attention_mask=attention_mask, decoder_input_ids=decoder_input_ids[:, t:t + 1],
                        cache=cache, use_cache=True)
            cache = cache_of(out)
            steps.append(out.logits)
    torch.testing.assert_close(torch.cat(steps, 1), full, atol=1e-5, rtol=1e-5)


def test_without_position_embeddings_the_model_runs():
    model = random_model(tiny_config(position_embedding="none", encoder_self_attention="mma"))
    assert model.model.encoder.embed_positions is None
    input_ids, attention_mask = source_batch()
    assert model.generate(input_ids=input_ids, attention_mask=attention_mask, max_new_tokens=4).shape[0] == 3


@pytest.mark.parametrize(
    "spec, message",
    [
        ({"encoder_attention_heads": 2, "encoder_self_attention": "mma"},
         r"2 heads are not divisible by 4 at `encoder_self_attention`; give `head_kinds`"),
        ({"encoder_self_attention": {"type": "mma", "head_kinds": ["global", "local", "sideways", "backward"]}},
         r"Unknown mma head kind\(s\) \['sideways'\]; accepted: global, local, forward, backward"),
        ({"encoder_self_attention": {"type": "mma", "head_kinds": ["global", "local"]}},
         r"must list one kind per head \(4 at `encoder_self_attention`\)"),
        ({"encoder_self_attention": {"type": "mma", "window": -1}},
         r"`window` must be a non-negative integer .* got -1"),
        ({"decoder_self_attention": "mma"}, r"cannot have 'forward' heads: a forward head attends to later positions"),
        ({"cross_attention": "mma"}, r"'mma' cannot be used at `cross_attention`"),
    ],
)
def test_bad_mma_specs_raise_clear_errors(spec, message):
    with pytest.raises(ValueError, match=message):
        tiny_config(**spec)


def test_head_kinds_constant_matches_paper():
    assert HEAD_KINDS == ("global", "local", "forward", "backward")
