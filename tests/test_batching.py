"""Token-budget batches (--max_tokens): the budget, coverage, shuffling, determinism and the split across ranks,
alone and inside HeadAttnSeq2SeqTrainer's dataloader."""

import numpy as np
import pytest
from accelerate.data_loader import BatchSamplerShard
from transformers import DataCollatorForSeq2Seq, Seq2SeqTrainingArguments

from hf_headattn import HeadAttnForConditionalGeneration
from hf_headattn.batching import TokenBudgetBatchSampler, padding_statistics
from hf_headattn.tokenization import train_tokenizer
from hf_headattn.toy_corpus import make_toy_corpus
from hf_headattn.trainer import HeadAttnSeq2SeqTrainer
from hf_headattn.training import tokenize_parallel

from helpers import tiny_config


def lengths(n: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    # few distinct lengths, so that many pairs tie and an epoch's shuffle changes which pairs share a batch
    return rng.integers(2, 20, n), rng.integers(2, 24, n)


def epoch_batches(sampler, epoch):
    sampler.set_epoch(epoch)
    return list(sampler)


@pytest.mark.parametrize("max_tokens", [48, 200, 1000])
def test_batches_respect_the_budget_and_cover_every_pair_once_per_epoch(max_tokens):
    sources, targets = lengths(500)
    sampler = TokenBudgetBatchSampler(sources, targets, max_tokens, seed=3)
    for epoch in range(3):
        batches = epoch_batches(sampler, epoch)
        assert len(batches) == len(sampler)
        assert sorted(index for batch in batches for index in batch) == list(range(500))
        for batch in batches:
            assert len(batch) * (sources[batch].max() + targets[batch].max()) <= max_tokens
    # length bucketing: much less padding than the same number of batches drawn at random
    statistics = padding_statistics(batches, sources, targets)
    random_batches = np.array_split(np.random.default_rng(0).permutation(500), len(batches))
    assert statistics["real_token_ratio"] > padding_statistics(random_batches, sources, targets)["real_token_ratio"]


def test_batches_differ_between_epochs_and_repeat_for_a_seed():
    sources, targets = lengths(300)
    sampler = TokenBudgetBatchSampler(sources, targets, 200, seed=0)
    first, second = epoch_batches(sampler, 0), epoch_batches(sampler, 1)
    assert first != second  # another order
    assert {frozenset(batch) for batch in first} != {frozenset(batch) for batch in second}  # other companions
    assert epoch_batches(TokenBudgetBatchSampler(sources, targets, 200, seed=0), 1) == second
    assert epoch_batches(TokenBudgetBatchSampler(sources, targets, 200, seed=1), 1) != second


def test_two_ranks_get_disjoint_batches_equal_in_number():
    odd_counts = 0
    for n in range(200, 212):  # some of these corpora pack into an odd number of batches
        sources, targets = lengths(n, seed=n)
        odd_counts += len(TokenBudgetBatchSampler(sources, targets, 150)) % 2
        sampler = TokenBudgetBatchSampler(sources, targets, 150, seed=5, num_replicas=2)
        for epoch in range(2):
            sampler.set_epoch(epoch)
            ranks = [list(BatchSamplerShard(sampler, num_processes=2, process_index=rank)) for rank in (0, 1)]
            assert len(ranks[0]) == len(ranks[1]) == len(sampler) // 2
            seen = [{index for batch in batches for index in batch} for batches in ranks]
            assert not seen[0] & seen[1] and seen[0] | seen[1] == set(range(n))
    assert odd_counts  # the split of a batch that makes the count even was exercised


def test_a_pair_longer_than_the_budget_is_refused():
    with pytest.raises(ValueError, match=r"--max_tokens 20 is smaller than the longest pair \(25 tokens"):
        TokenBudgetBatchSampler([5, 12], [3, 13], 20)


def test_trainer_dataloader_yields_padded_batches_within_the_budget(tmp_path):
    pairs = make_toy_corpus(120, seed=0)
    tokenizer = train_tokenizer(texts=[text for pair in pairs for text in pair], vocab_size=150)
    from datasets import Dataset

    dataset = tokenize_parallel(Dataset.from_dict({"source": [s for s, _ in pairs], "target": [t for _, t in pairs]}),
                                tokenizer, max_length=32)
    model = HeadAttnForConditionalGeneration(tiny_config(vocab_size=len(tokenizer)))
    trainer = HeadAttnSeq2SeqTrainer(
        model=model, args=Seq2SeqTrainingArguments(output_dir=str(tmp_path), use_cpu=True, report_to="none"),
        train_dataset=dataset, data_collator=DataCollatorForSeq2Seq(tokenizer, model=model), max_tokens=128,
    )
    batches = list(trainer.get_train_dataloader())
    assert sum(len(batch["input_ids"]) for batch in batches) == 120
    assert all(batch["input_ids"].numel() + batch["labels"].numel() <= 128 for batch in batches)
