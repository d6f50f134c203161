"""How sparse a trained model's attention is: the share of exact zeros in each site's weights, teacher-forced on a
parallel dataset (sparsemax, entmax and the constrained transforms give exact zeros; softmax none), as RESULTS.md
reports it beside BLEU (examples/benchmark_quality.py) and Correia et al. (2019, Sec. 5.2) measure it.

Tooling, not model runtime: never copied into a checkpoint.
"""

from collections.abc import Sequence

import torch

from .reference_batches import teacher_forced_batches

# attention site -> the model output that holds its weights, one [batch, heads, queries, keys] tensor a layer
SITE_OUTPUTS = {"encoder_self_attention": "encoder_attentions", "decoder_self_attention": "decoder_attentions",
                "cross_attention": "cross_attentions"}


def attention_zero_shares(model, tokenizer, sources: Sequence[str], targets: Sequence[str], batch_size: int = 32,
                          max_length: int = 128, progress: bool = True) -> dict[str, dict]:
    """Per attention site, the share of its weights that are exactly zero, teacher-forced on the references, over
    every layer and head and the (query, key) pairs a query may attend to (real tokens of both sides; in the
    decoder's self-attention, the earlier positions and its own): site -> {"zero_share": over all layers,
    "zero_share_by_layer": [layers], "weights": how many weights were counted}. A key the model adds beyond the
    source tokens (a <SINK>) counts as one the query may attend to. Sites whose weights the model does not return
    are left out."""
    zeros: dict[str, list[int]] = {}
    counted: dict[str, list[int]] = {}
    batches = teacher_forced_batches(model, tokenizer, sources, targets, batch_size=batch_size, max_length=max_length,
                                     desc="attention sparsity", progress=progress, output_attentions=True)
    was_training = model.training
    model.eval()
    for source_real, target_real, outputs in batches:
        causal = torch.ones(target_real.shape[1], target_real.shape[1], dtype=torch.bool).tril()
        allowed = {"encoder_self_attention": source_real[:, :, None] & source_real[:, None, :],
                   "decoder_self_attention": target_real[:, :, None] & target_real[:, None, :] & causal,
                   "cross_attention": target_real[:, :, None] & source_real[:, None, :]}
        for site, output in SITE_OUTPUTS.items():
            for layer, weights in enumerate(getattr(outputs, output, None) or ()):
                if weights is None:
                    continue
                mask = allowed[site]
                extra_keys = weights.shape[-1] - mask.shape[-1]
                if extra_keys > 0:  # a <SINK> key: open to every real query
                    mask = torch.cat([mask, mask[:, :, :1].new_ones(*mask.shape[:2], extra_keys)
                                      & mask.any(-1, keepdim=True)], dim=-1)
                mask = mask[:, None].expand(weights.shape)
                site_zeros, site_counted = zeros.setdefault(site, []), counted.setdefault(site, [])
                if len(site_zeros) <= layer:
                    site_zeros.append(0)
                    site_counted.append(0)
                site_zeros[layer] += int(((weights.float().cpu() == 0) & mask).sum())
                site_counted[layer] += int(mask.sum())
    model.train(was_training)
    return {site: {"zero_share": sum(zeros[site]) / max(sum(counted[site]), 1),
                   "zero_share_by_layer": [z / max(c, 1) for z, c in zip(zeros[site], counted[site])],
                   "weights": sum(counted[site])}
            for site in zeros}
