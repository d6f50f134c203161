"""Token-budget batches (--max_tokens): the budget, coverage, shuffling, determinism and the split across ranks,
alone and inside HeadAttnSeq2SeqTrainer's dataloader."""

import time

import numpy as np
import pytest
from accelerate.data_loader import BatchSamplerShard
from transformers import DataCollatorForSeq2Seq, Seq2SeqTrainingArguments

from hf_headattn import HeadAttnForConditionalGeneration
from hf_headattn.training.batching import TokenBudgetBatchSampler, TokenBudgetEpochCallback, padding_statistics
from hf_headattn.tokenization import train_tokenizer
from hf_headattn.toy_corpus import make_toy_corpus
from hf_headattn.training.data import tokenize_parallel
from hf_headattn.training.trainer import HeadAttnSeq2SeqTrainer

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


def companions(batches) -> dict:
    return {index: frozenset(batch) for batch in batches for index in batch}


@pytest.mark.parametrize("pool_pairs", [1, 37, 150, 1000])
def test_pooled_batches_respect_the_budget_and_cover_every_pair_once_in_every_epoch(pool_pairs):
    sources, targets = lengths(500)
    sampler = TokenBudgetBatchSampler(sources, targets, 200, seed=3, pool_pairs=pool_pairs)
    for epoch in (0, 1, 2, 40):  # 40: past the 32 epochs the batch count is taken from
        batches = epoch_batches(sampler, epoch)
        assert len(batches) == len(sampler)
        assert sorted(index for batch in batches for index in batch) == list(range(500))
        for batch in batches:
            assert len(batch) * (sources[batch].max() + targets[batch].max()) <= 200


def test_pooled_batches_change_companions_where_the_global_sort_keeps_them():
    sources, targets = lengths(600)
    sources, targets = sources * 7 + np.arange(600) % 7, targets  # nearly every source length distinct: few ties
    changed = {}
    for name, pool_pairs in (("global sort", None), ("pools", 150)):
        sampler = TokenBudgetBatchSampler(sources, targets, 400, seed=0, pool_pairs=pool_pairs)
        first, second = companions(epoch_batches(sampler, 0)), companions(epoch_batches(sampler, 1))
        changed[name] = sum(first[index] != second[index] for index in range(600)) / 600
    assert changed["global sort"] < 0.3 and changed["pools"] > 0.9, changed
    # a pool sorts its pairs: less padding than batches drawn at random, more than the global sort
    pooled = TokenBudgetBatchSampler(sources, targets, 400, seed=0, pool_pairs=150)
    exact = TokenBudgetBatchSampler(sources, targets, 400, seed=0)
    ratio = {name: padding_statistics(epoch_batches(sampler, 0), sources, targets)["real_token_ratio"]
             for name, sampler in (("pools", pooled), ("global sort", exact))}
    random_batches = np.array_split(np.random.default_rng(0).permutation(600), len(pooled))
    assert padding_statistics(random_batches, sources, targets)["real_token_ratio"] < ratio["pools"] < ratio[
        "global sort"]


def test_pooled_batches_repeat_for_a_seed():
    sources, targets = lengths(400)
    reference = TokenBudgetBatchSampler(sources, targets, 200, seed=4, pool_pairs=100)
    again = TokenBudgetBatchSampler(sources, targets, 200, seed=4, pool_pairs=100)
    assert len(again) == len(reference) == max(len(reference._pooled_packing(epoch)[1]) for epoch in range(32))
    assert epoch_batches(again, 3) == epoch_batches(reference, 3)
    assert epoch_batches(TokenBudgetBatchSampler(sources, targets, 200, seed=5, pool_pairs=100), 3) != \
        epoch_batches(reference, 3)


def test_a_late_epoch_that_packs_into_more_batches_draws_its_order_again():
    sources, targets = lengths(400)
    sampler = TokenBudgetBatchSampler(sources, targets, 200, seed=4, pool_pairs=100)
    counts = [len(sampler._pooled_packing(epoch)[1]) for epoch in range(32, 400)]
    late = 32 + counts.index(max(counts))
    assert max(counts) > len(sampler)  # this corpus has such an epoch
    batches = epoch_batches(sampler, late)
    assert len(batches) == len(sampler) and sorted(index for batch in batches for index in batch) == list(range(400))
    assert all(len(batch) * (sources[batch].max() + targets[batch].max()) <= 200 for batch in batches)
    assert epoch_batches(sampler, late) == batches  # drawn again the same way


def test_two_ranks_get_disjoint_batches_equal_in_number():
    odd_counts = 0
    for n in range(200, 212):  # some of these corpora pack into an odd number of batches
        sources, targets = lengths(n, seed=n)
        odd_counts += len(TokenBudgetBatchSampler(sources, targets, 150)) % 2
        for pool_pairs in (None, 60):
            sampler = TokenBudgetBatchSampler(sources, targets, 150, seed=5, num_replicas=2, pool_pairs=pool_pairs)
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


def toy_trainer(tmp_path, bucket_pool_pairs=None, **kwargs) -> HeadAttnSeq2SeqTrainer:
    """A trainer over 120 toy pairs with batches of at most 128 tokens; `kwargs` go to its arguments."""
    pairs = make_toy_corpus(120, seed=0)
    tokenizer = train_tokenizer(texts=[text for pair in pairs for text in pair], vocab_size=150)
    from datasets import Dataset

    dataset = tokenize_parallel(Dataset.from_dict({"source": [s for s, _ in pairs], "target": [t for _, t in pairs]}),
                                tokenizer, max_length=32)
    model = HeadAttnForConditionalGeneration(tiny_config(vocab_size=len(tokenizer)))
    return HeadAttnSeq2SeqTrainer(
        model=model, args=Seq2SeqTrainingArguments(output_dir=str(tmp_path), use_cpu=True, report_to="none", **kwargs),
        train_dataset=dataset, data_collator=DataCollatorForSeq2Seq(tokenizer, model=model), max_tokens=128,
        bucket_pool_pairs=bucket_pool_pairs,
    )


@pytest.mark.parametrize("bucket_pool_pairs", [None, 40])
def test_trainer_dataloader_yields_padded_batches_within_the_budget(bucket_pool_pairs, tmp_path):
    batches = list(toy_trainer(tmp_path, bucket_pool_pairs=bucket_pool_pairs).get_train_dataloader())
    assert sum(len(batch["input_ids"]) for batch in batches) == 120
    assert all(batch["input_ids"].numel() + batch["labels"].numel() <= 128 for batch in batches)


def test_pooled_batches_for_a_run_of_any_length_are_ready_at_once(tmp_path):
    """Epochs are packed as they begin: --max_steps 100,000,000 no longer packs millions of epochs up front."""
    lengths_of_runs = {}
    for max_steps in (20, 100_000_000):
        trainer = toy_trainer(tmp_path, bucket_pool_pairs=40, max_steps=max_steps)
        started = time.perf_counter()
        trainer.get_train_dataloader()
        assert time.perf_counter() - started < 10
        callback = next(c for c in trainer.callback_handler.callbacks if isinstance(c, TokenBudgetEpochCallback))
        lengths_of_runs[max_steps] = len(callback.sampler)
        callback.sampler.set_epoch(max_steps // callback.steps_per_epoch)  # the run's last epoch
        assert sum(len(batch) for batch in callback.sampler) == 120
    assert lengths_of_runs[20] == lengths_of_runs[100_000_000]
