#!/usr/bin/env python
"""Sentence batches against token-budget batches (the training command's `--max_tokens`) on Multi30k: how much
of each batch is padding, and how many real tokens a second a model trains on.

For each batching, over one epoch of the first --train_pairs training pairs (tokenised with a BPE tokenizer
trained on them, truncated to 128 tokens): batches per epoch, real and padded source + target tokens (and target
tokens alone) and their ratio; then forward + backward + AdamW steps of a softmax Transformer (--d_model x
--layers) on --timed_batches batches of each kind, interleaved, giving real (source + target) tokens per second.
Sentence batches are what Trainer draws by default: --batch_size random pairs.

    python examples/benchmark_batching.py --output benchmarks/batching.json       # ~3 min on 2 CPU cores
"""

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np
import torch
from transformers import DataCollatorForSeq2Seq

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # this checkout's package
from hf_headattn import HeadAttnConfig, HeadAttnForConditionalGeneration  # noqa: E402
from hf_headattn.training.batching import TokenBudgetBatchSampler, pair_lengths, padding_statistics  # noqa: E402
from hf_headattn.tokenization import train_tokenizer  # noqa: E402
from hf_headattn.parallel_data import read_parallel_files  # noqa: E402
from hf_headattn.training import multi30k_paths, tokenize_parallel  # noqa: E402


def sentence_batches(num_pairs: int, batch_size: int, seed: int) -> list[np.ndarray]:
    order = np.random.default_rng(seed).permutation(num_pairs)
    return [order[start : start + batch_size] for start in range(0, num_pairs, batch_size)]


def padding_report(batches, source_lengths, target_lengths) -> dict:
    both = padding_statistics(batches, source_lengths, target_lengths)
    target = padding_statistics(batches, np.zeros_like(source_lengths), target_lengths)
    return {"batches": len(batches), **both, "real_target_tokens": target["real_tokens"],
            "padded_target_tokens": target["padded_tokens"], "real_target_ratio": target["real_token_ratio"]}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data_dir", default="../shared/data/multi30k")
    parser.add_argument("--train_pairs", type=int, default=29000)
    parser.add_argument("--batch_size", type=int, default=64, help="sentences per sentence batch")
    parser.add_argument("--max_tokens", type=int, default=2000, help="token budget of a token-budget batch")
    parser.add_argument("--d_model", type=int, default=256)
    parser.add_argument("--layers", type=int, default=3)
    parser.add_argument("--timed_batches", type=int, default=20, help="training steps timed per batching")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--output", help="JSON file for the results")
    args = parser.parse_args(argv)
    if args.threads is not None:
        torch.set_num_threads(args.threads)

    data = multi30k_paths(args.data_dir)
    text = read_parallel_files(data["train.de"], data["train.en"], args.train_pairs, skip_empty=True)
    tokenizer = train_tokenizer(texts=[*text["source"], *text["target"]], vocab_size=8000)
    dataset = tokenize_parallel(text, tokenizer, max_length=128)
    source_lengths, target_lengths = pair_lengths(dataset)

    batchings = {
        f"{args.batch_size} sentences": sentence_batches(len(dataset), args.batch_size, args.seed),
        f"max_tokens {args.max_tokens}": list(TokenBudgetBatchSampler(source_lengths, target_lengths,
                                                                      args.max_tokens, seed=args.seed)),
    }
    results = {name: padding_report(batches, source_lengths, target_lengths) for name, batches in batchings.items()}

    torch.manual_seed(args.seed)
    config = HeadAttnConfig(vocab_size=len(tokenizer), d_model=args.d_model, encoder_layers=args.layers,
                            decoder_layers=args.layers, encoder_ffn_dim=4 * args.d_model,
                            decoder_ffn_dim=4 * args.d_model, pad_token_id=tokenizer.pad_token_id,
                            eos_token_id=tokenizer.eos_token_id, decoder_start_token_id=tokenizer.pad_token_id)
    model = HeadAttnForConditionalGeneration(config).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    collator = DataCollatorForSeq2Seq(tokenizer, model=model)
    timed = {name: [collator([dataset[int(i)] for i in batch]) for batch in batches[: args.timed_batches]]
             for name, batches in batchings.items()}
    seconds, real_tokens = dict.fromkeys(timed, 0.0), dict.fromkeys(timed, 0)
    for step in range(args.timed_batches):  # interleaved, so that load on the machine hits both alike
        for name, batches in timed.items():
            batch = batches[step]
            start = time.perf_counter()
            model(**batch).loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            seconds[name] += time.perf_counter() - start
            real_tokens[name] += int(batch["attention_mask"].sum() + (batch["labels"] != -100).sum())
    for name in timed:
        results[name]["train_real_tokens_per_s"] = real_tokens[name] / seconds[name]

    report = {"settings": vars(args), "threads": torch.get_num_threads(), "cpu": platform.processor() or
              platform.machine(), "pairs": len(dataset), "results": results}
    print(f"\nMulti30k train, {len(dataset):,} pairs, one epoch; training a {args.d_model} x {args.layers} softmax "
          f"Transformer on {torch.get_num_threads()} threads\n")
    print("| batching | batches | real / padded tokens (src + tgt) | real / padded target tokens | "
          "train real tokens/s |\n|---|---|---|---|---|")
    for name, row in results.items():
        print(f"| {name} | {row['batches']:,} | {row['real_tokens']:,} / {row['padded_tokens']:,} "
              f"({row['real_token_ratio']:.0%}) | {row['real_target_tokens']:,} / {row['padded_target_tokens']:,} "
              f"({row['real_target_ratio']:.0%}) | {row['train_real_tokens_per_s']:,.0f} |")
    if args.output:
        Path(args.output).parent.mkdir(parents=True, exist_ok=True)
        Path(args.output).write_text(json.dumps(report, indent=2) + "\n")
    return report


if __name__ == "__main__":
    main()
