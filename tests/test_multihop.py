"""The `multihop` cross-attention variant (Iida et al., 2019): Eq. 7-9 and 19 recomputed head by head, and the
parameter counts of Table 5's rule ((2N + 1) d^2 per dependent hop, N d^2 per independent hop, plus v_b)."""

import math

import pytest
import torch

from hf_headattn import HeadAttnConfig, HeadAttnForConditionalGeneration
from hf_headattn.runtime.attention_base import AttentionMask
from hf_headattn.runtime.attention_multihop import MultiHopAttention

from helpers import random_model, tiny_config


@pytest.mark.parametrize("hop_mode, per_hop", [("dependent", 9 * 128 * 128 + 128), ("independent", 4 * 128 * 128)])
@pytest.mark.parametrize("hops", [1, 2])
def test_parameters_per_hop(hop_mode, per_hop, hops):
    """d_model 512 with 4 heads: d_k = 128. A dependent hop has W_b (d_k^2), N U_b and N U_c (2N d_k^2) and v_b
    (d_k, which Table 5 leaves out); an independent hop only the N U_c."""
    config = HeadAttnConfig(vocab_size=100, d_model=512, encoder_layers=1, decoder_layers=1, encoder_attention_heads=4,
                            decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64,
                            cross_attention={"type": "multihop", "hops": hops, "hop_mode": hop_mode})
    model = HeadAttnForConditionalGeneration(config)
    variants = [module for module in model.modules() if isinstance(module, MultiHopAttention)]
    assert len(variants) == 1
    assert sum(p.numel() for p in variants[0].parameters()) == hops * per_hop


@pytest.mark.parametrize("hop_mode", ["dependent", "independent"])
def test_hops_follow_equations_7_to_9_and_19(hop_mode):
    model = random_model(tiny_config(cross_attention={"type": "multihop", "hops": 2, "hop_mode": hop_mode,
                                                      "layers": [0]}), std=0.3).double()
    attention = model.model.decoder.layers[0].encoder_attn
    hops = attention.variant.second_hops
    torch.manual_seed(0)
    x = torch.randn(2, 3, 32, dtype=torch.float64)
    memory = torch.randn(2, 5, 32, dtype=torch.float64)
    output, result = attention(x, AttentionMask(None), key_value_states=memory, output_head_importances=True)
    q = attention.q_proj(x).view(2, 3, 4, 8)
    k = attention.k_proj(memory).view(2, 5, 4, 8)
    v = attention.v_proj(memory).view(2, 5, 4, 8)
    for b in range(2):
        for t in range(3):
            contexts = [torch.softmax(k[b, :, h] @ q[b, t, h] / math.sqrt(8), 0) @ v[b, :, h] for h in range(4)]
            for hop in range(2):
                U_c = hops.u_c[hop]
                if hop_mode == "independent":
                    contexts = [U_c[h] @ contexts[h] for h in range(4)]  # Eq. 19
                    continue
                W_b, v_b, U_b = hops.w_b[hop].weight, hops.v_b[hop].weight[0], hops.u_b[hop]
                e = torch.stack([v_b @ torch.tanh(W_b @ q[b, t, h] + U_b[h] @ contexts[h]) for h in range(4)])  # Eq. 7
                beta = torch.softmax(e, 0)  # Eq. 8
                contexts = [beta[h] * (U_c[h] @ contexts[h]) for h in range(4)]  # Eq. 9
            expected = attention.out_proj(torch.cat(contexts))
            torch.testing.assert_close(output[b, t], expected)
            if hop_mode == "dependent":
                torch.testing.assert_close(result.head_importances[b, t], beta)


def test_zero_hops_is_plain_multi_head_attention():
    plain = random_model(tiny_config(), seed=3)
    zero_hops = random_model(tiny_config(cross_attention={"type": "multihop", "hops": 0}), seed=3)
    ids = torch.randint(2, 64, (2, 6), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        torch.testing.assert_close(zero_hops(input_ids=ids, decoder_input_ids=ids).logits,
                                   plain(input_ids=ids, decoder_input_ids=ids).logits)


@pytest.mark.parametrize("spec, message", [
    ({"type": "multihop", "hops": -1}, "`hops` must be an integer >= 0"),
    ({"type": "multihop", "hop_mode": "shared"}, "Unknown `hop_mode` 'shared'; accepted: dependent, independent"),
])
def test_bad_multihop_options_are_clear_errors(spec, message):
    with pytest.raises(ValueError, match=message):
        tiny_config(cross_attention=spec)


def test_transformer_hops_start_as_the_identity_on_the_contexts():
    """A fresh Transformer `multihop` module passes the first hop's contexts on at their scale: exactly for
    independent hops (U_c = I), and for dependent ones up to beta's distance from uniform (U_c = N I, beta ~ 1/N);
    exactly again once the head scores are flat (v_b = 0)."""
    from hf_headattn.runtime.attention_multihop import HeadHops

    torch.manual_seed(0)
    heads, dim = 4, 8
    queries, contexts = torch.randn(2, 5, heads, dim), torch.randn(2, 5, heads, dim)
    independent = HeadHops(heads, dim, hops=2, hop_mode="independent", start_as_identity=True)
    torch.testing.assert_close(independent(queries, contexts)[0], contexts)
    dependent = HeadHops(heads, dim, hops=1, hop_mode="dependent", start_as_identity=True)
    with torch.no_grad():
        dependent.v_b[0].weight.zero_()
    torch.testing.assert_close(dependent(queries, contexts)[0], contexts)
    # a fresh model's hop (W_b, U_b and v_b drawn with std init_std = 0.02): beta ~ 1/N, contexts kept
    model = HeadAttnForConditionalGeneration(tiny_config(cross_attention="multihop"))
    hops = model.model.decoder.layers[0].encoder_attn.variant.second_hops
    u_c = hops.u_c[0]
    torch.testing.assert_close(u_c, torch.eye(u_c.shape[-1]).repeat(u_c.shape[0], 1, 1) * u_c.shape[0])
    queries, contexts = torch.randn(2, 5, *u_c.shape[:2]), torch.randn(2, 5, *u_c.shape[:2])
    output, beta = hops(queries, contexts)
    assert (beta - 1 / u_c.shape[0]).abs().max() < 0.01
    assert 0.95 < output.norm() / contexts.norm() < 1.05
