"""Diagnostic beside benchmark_quality.py: the multi30k-anchor recipe in a minimal PyTorch loop (no Trainer, no
Accelerate), on the training command's own tokenizer and token-budget batches, scored by greedy BLEU on
test_2016_flickr at the steps given. It tells whether a gap to the anchor lies in the command or elsewhere, and
trains Transformers' MarianMTModel in the same loop as an independent reference.

    python benchmarks/quality/plain_loop.py --tokenizer runs/quality/transformer-softmax/seed-1 --seed 2 \
        --steps 520 --eval-steps 520 --model headattn
"""

import argparse
import json
import time

import torch
from transformers import DataCollatorForSeq2Seq, MarianConfig, MarianMTModel, get_inverse_sqrt_schedule, set_seed

from hf_headattn.training.batching import TokenBudgetBatchSampler, pair_lengths
from hf_headattn.runtime.configuration_headattn import HeadAttnConfig
from hf_headattn.runtime.modeling_headattn import HeadAttnForConditionalGeneration
from hf_headattn.tokenization import load_tokenizer
from hf_headattn.metrics import score_translations
from hf_headattn.parallel_data import read_parallel_files
from hf_headattn.training import multi30k_paths, tokenize_parallel
from hf_headattn.translation import translate_sentences

SHAPE = dict(d_model=256, encoder_layers=3, decoder_layers=3, encoder_attention_heads=4, decoder_attention_heads=4,
             encoder_ffn_dim=1024, decoder_ffn_dim=1024, dropout=0.1, max_position_embeddings=512)


def build(kind: str, tokenizer):
    ids = dict(vocab_size=len(tokenizer), pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id,
               decoder_start_token_id=tokenizer.pad_token_id)
    if kind == "headattn":  # the training command's model: swish, embeddings scaled by sqrt(d_model)
        return HeadAttnForConditionalGeneration(HeadAttnConfig(**SHAPE, **ids, label_smoothing=0.1))
    extra = {} if kind == "marian-defaults" else dict(activation_function="swish", scale_embedding=True)
    config = MarianConfig(**SHAPE, **ids, decoder_vocab_size=len(tokenizer), share_encoder_decoder_embeddings=True,
                          tie_word_embeddings=True, **extra)
    return MarianMTModel(config)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokenizer", required=True, help="a tokenizer folder (e.g. a benchmark run's model)")
    parser.add_argument("--model", choices=["headattn", "marian-defaults", "marian-swish"], default="headattn")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--steps", type=int, default=520)
    parser.add_argument("--eval-steps", default="520", help="comma-separated steps to score")
    parser.add_argument("--data-dir", default="../shared/data/multi30k")
    args = parser.parse_args()
    evaluations = {int(step) for step in args.eval_steps.split(",")}

    paths = multi30k_paths(args.data_dir)
    tokenizer = load_tokenizer(args.tokenizer)
    set_seed(args.seed)
    model = build(args.model, tokenizer)
    model.generation_config.max_length = 64  # longer than any reference; stops degenerate early outputs sooner
    train = tokenize_parallel(read_parallel_files(paths["train.de"], paths["train.en"], skip_empty=True), tokenizer)
    sampler = TokenBudgetBatchSampler(*pair_lengths(train), max_tokens=4500, seed=args.seed)
    collate = DataCollatorForSeq2Seq(tokenizer, model=model, label_pad_token_id=-100)
    optimizer = torch.optim.AdamW(model.parameters(), lr=5e-4, betas=(0.9, 0.98), eps=1e-9, weight_decay=0.0)
    schedule = get_inverse_sqrt_schedule(optimizer, num_warmup_steps=1000)
    sources = paths["test_2016_flickr.de"].read_text(encoding="utf-8").splitlines()
    references = paths["test_2016_flickr.en"].read_text(encoding="utf-8").splitlines()

    step, epoch, start = 0, 0, time.time()
    while step < args.steps:
        sampler.set_epoch(epoch)
        for indices in sampler:
            batch = collate([train[index] for index in indices])
            model.train()
            logits = model(**batch).logits
            # label-smoothed CE over the batch's label tokens, the loss HeadAttn computes itself
            loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                                     batch["labels"].reshape(-1), ignore_index=-100,
                                                     label_smoothing=0.1)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            schedule.step()
            optimizer.zero_grad()
            step += 1
            if step % 50 == 0:
                print(f"step {step} loss {loss.item():.3f} {time.time() - start:.0f} s", flush=True)
            if step in evaluations:
                model.eval()
                hypotheses = translate_sentences(model, tokenizer, sources, num_beams=1, batch_size=64)
                bleu = score_translations(hypotheses, references)["bleu"]
                print(json.dumps({"model": args.model, "seed": args.seed, "step": step, "greedy_bleu": bleu}),
                      flush=True)
            if step >= args.steps:
                break
        epoch += 1


if __name__ == "__main__":
    main()
