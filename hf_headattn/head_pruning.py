"""Importance-guided head pruning for DHICM models (the paper's future work, Sec. 8): average every head's
importance G(x, O^h) over the real tokens of a dataset, then remove the least important heads of each DHICM
module for good (`HeadAttnPreTrainedModel.prune_heads` shrinks the projections).

Tooling, not model runtime: never copied into a checkpoint (a pruned model needs nothing from here to load).
"""

import torch
from tqdm.auto import tqdm


def mean_head_importances(model, tokenizer, sources: list[str], targets: list[str], batch_size: int = 32,
                          max_length: int = 128) -> dict[str, torch.Tensor]:
    """Each DHICM module's mean head importance over a parallel dataset, teacher-forced on the references:
    module name -> [heads], averaged over real source tokens (encoder modules) or real target tokens (decoder
    modules). Heads are numbered among the module's current heads."""
    if len(sources) != len(targets):
        raise ValueError(f"{len(sources)} sources but {len(targets)} targets; give line-aligned parallel text")
    sums: dict[str, torch.Tensor] = {}
    counts: dict[str, float] = {}
    was_training = model.training
    model.eval()
    for start in tqdm(range(0, len(sources), batch_size), desc="head importances"):
        batch = tokenizer(sources[start : start + batch_size], text_target=targets[start : start + batch_size],
                          return_tensors="pt", padding=True, truncation=True, max_length=max_length)
        labels = batch["labels"].masked_fill(batch["labels"] == tokenizer.pad_token_id, -100)
        with torch.no_grad():
            outputs = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], labels=labels,
                            output_head_importances=True)
        for name, importances in (outputs.head_importances or {}).items():
            real = batch["attention_mask"].bool() if name.startswith("encoder.") else labels.ne(-100)
            sums[name] = sums.get(name, 0.0) + importances[real].sum(0)
            counts[name] = counts.get(name, 0.0) + float(real.sum())
    model.train(was_training)
    if not sums:
        raise ValueError("This model has no DHICM module, so its heads have no importances")
    return {name: sums[name] / counts[name] for name in sums}


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

