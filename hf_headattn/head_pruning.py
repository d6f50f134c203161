"""Importance-guided head pruning for DHICM models (the paper's future work, Sec. 8): average every head's
importance G(x, O^h) over the real tokens of a dataset, then remove the least important heads of each DHICM
module for good (`HeadAttnPreTrainedModel.prune_heads` shrinks the projections).

Tooling, not model runtime: never copied into a checkpoint (a pruned model needs nothing from here to load).
"""

import math

import torch

from .reference_batches import teacher_forced_batches


def mean_head_importances(model, tokenizer, sources: list[str], targets: list[str], batch_size: int = 32,
                          max_length: int = 128) -> dict[str, torch.Tensor]:
    """Each DHICM module's mean head importance over a parallel dataset, teacher-forced on the references:
    module name -> [heads], averaged over real source tokens (encoder modules) or real target tokens (decoder
    modules). Heads are numbered among the module's current heads."""
    statistics = head_importance_statistics(model, tokenizer, sources, targets, batch_size, max_length)
    return {name: module["mean_importance"] for name, module in statistics.items()}


def head_importance_statistics(model, tokenizer, sources: list[str], targets: list[str], batch_size: int = 32,
                               max_length: int = 128, concentrated: float = 0.9) -> dict[str, dict]:
    """How each DHICM module spreads its importances G(x, O^h) over the heads on a parallel dataset,
    teacher-forced on the references, over real source tokens (encoder modules) or real target tokens (decoder
    modules): module name -> {"mean_importance": [heads], "mean_kl": the mean KL from uniform of Eq. 4 (0 when
    uniform, ln H when all on one head), "ln_heads": ln H, "concentrated_share": the share of tokens whose most
    important head gets at least `concentrated`, "top_head_share": [heads], how often each head is the most
    important, "tokens"}."""
    totals: dict[str, dict] = {}
    batches = teacher_forced_batches(model, tokenizer, sources, targets, batch_size=batch_size, max_length=max_length,
                                     desc="head importances", output_head_importances=True)
    was_training = model.training
    model.eval()
    for source_real, target_real, outputs in batches:
        for name, importances in (outputs.head_importances or {}).items():
            real = source_real if name.startswith("encoder.") else target_real
            importances = importances[real.to(importances.device)].float().cpu()  # [tokens, heads]
            heads = importances.shape[-1]
            kl = (importances * (importances.clamp_min(1e-12).log() + math.log(heads))).sum(-1)
            top_values, top_heads = importances.max(-1)
            total = totals.setdefault(name, {"importance": torch.zeros(heads), "kl": 0.0, "concentrated": 0,
                                             "top": torch.zeros(heads), "tokens": 0})
            total["importance"] += importances.sum(0)
            total["kl"] += float(kl.sum())
            total["concentrated"] += int((top_values >= concentrated).sum())
            total["top"] += torch.bincount(top_heads, minlength=heads).float()
            total["tokens"] += importances.shape[0]
    model.train(was_training)
    if not totals:
        raise ValueError("This model has no DHICM module, so its heads have no importances")
    return {name: {"mean_importance": total["importance"] / total["tokens"], "mean_kl": total["kl"] / total["tokens"],
                   "ln_heads": math.log(len(total["importance"])),
                   "concentrated_share": total["concentrated"] / total["tokens"],
                   "top_head_share": total["top"] / total["tokens"], "tokens": total["tokens"]}
            for name, total in totals.items()}


def prune_least_important_heads(model, importances: dict[str, torch.Tensor], heads_per_module: int,
                                modules: list[str] | None = None) -> dict[str, list[int]]:
    """Remove the `heads_per_module` least important heads of every module in `importances` (or only of
    `modules`). Returns what was removed, as module name -> original head indices (as in
    `config.pruned_heads`)."""
    chosen = list(importances) if modules is None else modules
    unknown = [name for name in chosen if name not in importances]
    if unknown:
        raise ValueError(f"No importances for module(s) {unknown}; modules with importances: {list(importances)}")
    to_prune = {}
    for name in chosen:
        num_heads = importances[name].numel()
        if not 0 < heads_per_module < num_heads:
            raise ValueError(f"Cannot remove {heads_per_module} of the {num_heads} heads of {name!r}; remove between "
                             f"1 and {num_heads - 1}")
        kept = model.config.kept_heads(*model.config.attention_modules()[name])
        least = torch.argsort(importances[name])[:heads_per_module].tolist()
        to_prune[name] = sorted(kept[position] for position in least)
    model.prune_heads(to_prune)
    return to_prune

