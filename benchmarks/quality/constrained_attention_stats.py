#!/usr/bin/env python
"""Where a sparse or constrained model's source attention goes, teacher-forced on a parallel set.

A diagnostic for RESULTS.md's notes, not a table row. For every cross-attention layer (one for the LSTMs), over the
real target tokens: the share of attention that goes to the <SINK> token (1 - the attention on real source tokens),
by fifth of the target sentence; how many real source tokens get any attention, and how often only one does
(where sparsemax passes the scores no gradient); the weight of the most-attended token and how often it sits at
its bound u_t = f - beta_{t-1} (where csparsemax passes its score no gradient); and, at the end of each sentence,
how many real source tokens have used up their fertility. Per sentence: the sum of the real source tokens'
fertilities against the number of target tokens. A model without fertility (sparsemax, softmax) gets the first
four only; the others are null.

    python benchmarks/quality/constrained_attention_stats.py --model runs/quality/lstm-csparsemax-predicted/seed-2 \\
        --source ../shared/data/multi30k/test_2016_flickr.de --target ../shared/data/multi30k/test_2016_flickr.en
"""

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # this checkout's package
from hf_headattn.loading import load_model_and_tokenizer  # noqa: E402

FIFTHS = 5


def statistics(model, tokenizer, sources: list[str], targets: list[str], batch_size: int) -> dict:
    model.eval()
    sink_by_fifth = torch.zeros(FIFTHS)
    tokens_by_fifth = torch.zeros(FIFTHS)
    attended, one_token, top_weight, top_at_bound, exhausted = 0.0, 0.0, 0.0, 0.0, 0.0
    source_tokens, target_tokens = 0, 0
    fertility_sums, target_lengths = [], []
    for start in range(0, len(sources), batch_size):
        batch = tokenizer(sources[start:start + batch_size], text_target=targets[start:start + batch_size],
                          return_tensors="pt", padding=True, truncation=True, max_length=128)
        labels = batch["labels"].masked_fill(batch["labels"] == tokenizer.pad_token_id, -100)
        with torch.no_grad():
            encoder_outputs = model.get_encoder()(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"])
            outputs = model(encoder_outputs=encoder_outputs, attention_mask=batch["attention_mask"], labels=labels,
                            output_attentions=True)
        fertility = getattr(encoder_outputs, "fertility", None)  # [batch, source_len], 0 at padding
        source_mask = batch["attention_mask"].bool()
        target_mask = labels.ne(-100)
        lengths = target_mask.sum(-1)
        if fertility is not None:
            fertility_sums += fertility.masked_fill(~source_mask, 0).sum(-1).tolist()
            target_lengths += lengths.tolist()
        position = torch.arange(labels.shape[1])[None, :].expand_as(labels)
        fifth = (position * FIFTHS // lengths.clamp_min(1)[:, None]).clamp(max=FIFTHS - 1)
        for weights in outputs.cross_attentions:  # [batch, heads, target_len, source_len], real sources only
            weights = weights.float() * source_mask[:, None, None, :]
            sink = 1 - weights.sum(-1).mean(1)  # [batch, target_len]
            sink_by_fifth += torch.zeros(FIFTHS).index_add(0, fifth[target_mask], sink[target_mask])
            tokens_by_fifth += torch.bincount(fifth[target_mask], minlength=FIFTHS).float()
            support = (weights > 0).sum(-1)  # [batch, heads, target_len]
            attended += float(support.float().mean(1)[target_mask].sum())
            one_token += float((support == 1).float().mean(1)[target_mask].sum())
            target_tokens += int(target_mask.sum())
            top, top_index = weights.max(-1)  # [batch, heads, target_len]
            top_weight += float(top.mean(1)[target_mask].sum())
            source_tokens += int(source_mask.sum())
            if fertility is None:
                continue
            bound = (fertility[:, None, None, :] - (weights.cumsum(2) - weights)).clamp(min=0)  # u_t, Eq. 5
            at_bound = (top > 0) & (top >= bound.gather(-1, top_index[..., None]).squeeze(-1) - 1e-5)
            top_at_bound += float(at_bound.float().mean(1)[target_mask].sum())
            cumulative = (weights * target_mask[:, None, :, None]).sum(2)  # [batch, heads, source_len]
            used_up = (cumulative >= fertility[:, None, :] - 1e-3) & source_mask[:, None, :]
            exhausted += float(used_up.float().mean(1).sum())
    has_fertility = bool(fertility_sums)
    ratio = torch.tensor(fertility_sums) / torch.tensor(target_lengths).clamp_min(1) if has_fertility else None
    return {
        "sink_share_by_fifth_of_target": (sink_by_fifth / tokens_by_fifth).tolist(),
        "sink_share": float(sink_by_fifth.sum() / tokens_by_fifth.sum()),
        "source_tokens_attended_per_step": attended / target_tokens,
        "steps_attending_one_source_token": one_token / target_tokens,
        "weight_of_the_most_attended_token": top_weight / target_tokens,
        "steps_whose_most_attended_token_is_at_its_bound": top_at_bound / target_tokens if has_fertility else None,
        "source_tokens_exhausted_at_end": exhausted / source_tokens if has_fertility else None,
        "fertility_sum_over_target_length": {"mean": float(ratio.mean()),
                                             "share_below_1": float((ratio < 1).float().mean())}
        if has_fertility else None,
        "sentences": len(sources),
    }


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True,
                        help="a model folder (fertility statistics need one trained with --fertility)")
    parser.add_argument("--source", required=True)
    parser.add_argument("--target", required=True)
    parser.add_argument("--batch-size", type=int, default=64)
    args = parser.parse_args(argv)
    model, tokenizer = load_model_and_tokenizer(args.model)
    sources = Path(args.source).read_text(encoding="utf-8").splitlines()
    targets = Path(args.target).read_text(encoding="utf-8").splitlines()
    print(json.dumps(statistics(model, tokenizer, sources, targets, args.batch_size), indent=2))


if __name__ == "__main__":
    main()
