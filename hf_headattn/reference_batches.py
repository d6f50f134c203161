"""Teacher-forced passes over a parallel dataset, batch by batch: what the tooling's statistics of a trained model
read (DHICM's head importances, `head_pruning`; the share of exact zeros in attention, `attention_sparsity`).

Tooling, not model runtime: never copied into a checkpoint.
"""

from collections.abc import Iterator, Sequence

import torch
from tqdm.auto import tqdm


def teacher_forced_batches(model, tokenizer, sources: Sequence[str], targets: Sequence[str], *, batch_size: int,
                           max_length: int, desc: str, progress: bool = True,
                           **forward_flags) -> Iterator[tuple[torch.Tensor, torch.Tensor, object]]:
    """Each batch of (source, reference) pairs fed to `model` with the references as labels, without gradients:
    yields (source_real [batch, source_len] bool, target_real [batch, target_len] bool, the model's outputs), the
    masks on the CPU. `forward_flags` go to the forward (e.g. ``output_attentions=True``). Texts of different
    lengths are refused at the call, before any batch."""
    if len(sources) != len(targets):
        raise ValueError(f"{len(sources)} sources but {len(targets)} targets; give line-aligned parallel text")

    def batches():
        for start in tqdm(range(0, len(sources), batch_size), desc=desc, disable=not progress):
            batch = tokenizer(list(sources[start:start + batch_size]),
                              text_target=list(targets[start:start + batch_size]), return_tensors="pt",
                              padding=True, truncation=True, max_length=max_length)
            labels = batch["labels"].masked_fill(batch["labels"] == tokenizer.pad_token_id, -100)
            with torch.no_grad():
                outputs = model(input_ids=batch["input_ids"].to(model.device),
                                attention_mask=batch["attention_mask"].to(model.device),
                                labels=labels.to(model.device), **forward_flags)
            yield batch["attention_mask"].bool(), labels.ne(-100), outputs

    return batches()
