"""The entmax attention variants (`entmax15`, `entmax_alpha`): options, the learned alpha per head (its start, its
gradient, its range), and agreement between the fixed and learned forms; the invariants (cache, padding, beam
search, fast path, host syncs, remote code) run over them through `helpers.VARIANT_CONFIGS` / `TRANSFORMER_VARIANTS`."""

import pytest
import torch

from hf_headattn.runtime.attention_entmax import LOWEST_LEARNED_ALPHA

from helpers import random_model, source_batch, tiny_config


def _variants(model):
    """The encoder's self-attention variants."""
    return [layer.self_attn.variant for layer in model.model.encoder.layers]


@pytest.mark.parametrize("alpha, message", [
    (2.5, r"entmax_alpha option `alpha` must be a number in \(1, 2\]"),
    (1.0, r"entmax_alpha option `alpha` \(null: learned per head\) must be a finite number > 1"),
    (float("nan"), "must be a finite number"),
    ("1.5", "must be a finite number"),
    (True, "must be a finite number"),
])
def test_a_fixed_alpha_outside_its_range_is_refused(alpha, message):
    with pytest.raises(ValueError, match=message):
        tiny_config(cross_attention={"type": "entmax_alpha", "alpha": alpha})


def test_entmax15_takes_no_options():
    with pytest.raises(ValueError, match="'entmax15' at `cross_attention` does not take option"):
        tiny_config(cross_attention={"type": "entmax15", "alpha": 1.5})


def test_learned_alphas_start_at_one_and_a_half_and_learn():
    model = random_model(tiny_config(encoder_self_attention="entmax_alpha"))
    for variant in _variants(model):
        torch.nn.init.zeros_(variant.alpha_logit)
        torch.testing.assert_close(variant.head_alphas(), torch.full((4,), 1.5))
    input_ids, attention_mask = source_batch()
    loss = model(input_ids=input_ids, attention_mask=attention_mask, labels=input_ids).loss
    loss.backward()
    for variant in _variants(model):
        assert variant.alpha_logit.grad.shape == (4,) and (variant.alpha_logit.grad != 0).all()
    # kept in (1, 2): a logit far below zero stops at the lowest learned alpha, one far above stays below 2
    variant = _variants(model)[0]
    with torch.no_grad():
        variant.alpha_logit.copy_(torch.tensor([-50.0, -5.0, 5.0, 50.0]))
    alphas = variant.head_alphas().detach()
    assert float(alphas[0]) == pytest.approx(LOWEST_LEARNED_ALPHA) and 1 < alphas[1] < 1.01 and 1.99 < alphas[2] < 2
    assert alphas[3] <= 2


def test_fixed_alpha_has_no_parameter_and_matches_the_learned_form_and_entmax15():
    input_ids, attention_mask = source_batch()
    learned = random_model(tiny_config(encoder_self_attention="entmax_alpha", cross_attention="entmax_alpha"))
    with torch.no_grad():
        for name, parameter in learned.named_parameters():
            if name.endswith("alpha_logit"):
                parameter.zero_()  # alpha 1.5 in every head
    fixed = random_model(tiny_config(encoder_self_attention={"type": "entmax_alpha", "alpha": 1.5},
                                     cross_attention={"type": "entmax_alpha", "alpha": 1.5}))
    exact = random_model(tiny_config(encoder_self_attention="entmax15", cross_attention="entmax15"))
    assert not any(name.endswith("alpha_logit") for name, _ in fixed.named_parameters())
    state = {name: value for name, value in learned.state_dict().items() if not name.endswith("alpha_logit")}
    fixed.load_state_dict(state)
    exact.load_state_dict(state)
    decoder_input_ids = input_ids[:, :5]
    with torch.no_grad():
        logits = [model(input_ids=input_ids, attention_mask=attention_mask, decoder_input_ids=decoder_input_ids).logits
                  for model in (learned, fixed, exact)]
    torch.testing.assert_close(logits[0], logits[1], rtol=0, atol=0)
    torch.testing.assert_close(logits[1], logits[2], rtol=1e-5, atol=1e-5)  # bisection against the sort


def test_learned_alphas_cannot_be_pruned():
    with pytest.raises(ValueError, match="'entmax_alpha' ties each head to its index"):
        tiny_config(encoder_self_attention="entmax_alpha", pruned_heads={"encoder.layers.0.self_attn": [1]})
    model = random_model(tiny_config(encoder_self_attention="entmax15"))
    model.prune_heads({"encoder.layers.0.self_attn": [1]})  # entmax15 keeps nothing per head
    assert model.model.encoder.layers[0].self_attn.num_heads == 3
