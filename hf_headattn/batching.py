"""Token-budget batches for training (fairseq's `--max-tokens`): length-bucketed batches of sentence pairs whose
padded size stays within a number of tokens, used by `HeadAttnSeq2SeqTrainer` under the training command's
`--max_tokens`.

Tooling, not model runtime: never copied into a checkpoint.
"""

import math

import numpy as np
from transformers import TrainerCallback


class TokenBudgetBatchSampler:
    """Batches of pair indices whose padded size, pairs x (longest source + longest target), is at most
    `max_tokens`: padding counts, since it is what the model computes on.

    Pairs are sorted by source then target length and packed greedily in that order; ties (pairs of equal
    lengths) are broken by a shuffle drawn anew every epoch, and the batches come out in a shuffled order. The
    packing depends only on the lengths, so every epoch has the same number of batches (Trainer counts steps
    from `len()`) while the batches themselves differ.

    Under several processes, Accelerate's `BatchSamplerShard` deals the batches out round-robin, so each rank
    trains on its own batches. The number of batches is made a multiple of `num_replicas` (by halving the
    largest batches) so that every rank takes the same number of steps and no batch is repeated.

    An epoch's batches depend only on `seed` and the epoch set with `set_epoch`, which is what makes a resumed
    run (Trainer skips the batches it already trained on) see the batches an uninterrupted run sees.
    """

    def __init__(self, source_lengths, target_lengths, max_tokens: int, seed: int = 0, num_replicas: int = 1):
        self.source_lengths = np.asarray(source_lengths, dtype=np.int64)
        self.target_lengths = np.asarray(target_lengths, dtype=np.int64)
        if self.source_lengths.shape != self.target_lengths.shape or self.source_lengths.ndim != 1:
            raise ValueError("source_lengths and target_lengths must be 1-D and of equal length")
        if len(self.source_lengths) < num_replicas:
            raise ValueError(f"{len(self.source_lengths)} training pairs cannot fill a batch on each of "
                             f"{num_replicas} processes")
        longest = int((self.source_lengths + self.target_lengths).max())
        if longest > max_tokens:
            raise ValueError(f"--max_tokens {max_tokens} is smaller than the longest pair ({longest} tokens, "
                             "source + target)")
        self.max_tokens = max_tokens
        self.seed = seed
        self.num_replicas = num_replicas
        self.epoch = 0
        order = np.lexsort((self.target_lengths, self.source_lengths))
        self.batch_sizes = self._pack(self.source_lengths[order], self.target_lengths[order])

    def _pack(self, source_lengths: np.ndarray, target_lengths: np.ndarray) -> list[int]:
        """Sizes of consecutive batches over pairs in length order, each within the budget, as many as a
        multiple of `num_replicas`."""
        sizes, count, longest_source, longest_target = [], 0, 0, 0
        for source_length, target_length in zip(source_lengths.tolist(), target_lengths.tolist()):
            longest_source, longest_target = max(longest_source, source_length), max(longest_target, target_length)
            if count and (count + 1) * (longest_source + longest_target) > self.max_tokens:
                sizes.append(count)
                count, longest_source, longest_target = 0, source_length, target_length
            count += 1
        sizes.append(count)
        while len(sizes) % self.num_replicas:
            largest = int(np.argmax(sizes))
            if sizes[largest] < 2:
                raise ValueError(f"--max_tokens {self.max_tokens} leaves one pair per batch; the {len(sizes)} "
                                 f"batches cannot be dealt out evenly to {self.num_replicas} processes")
            half = sizes[largest] // 2
            sizes[largest : largest + 1] = [sizes[largest] - half, half]
        return sizes

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return len(self.batch_sizes)

    def __iter__(self):
        rng = np.random.default_rng([self.seed, self.epoch])
        shuffled = rng.permutation(len(self.source_lengths))
        # lexsort is stable: pairs of equal lengths keep this epoch's random order, and the length sequence (hence
        # the packing) is the same as in __init__
        order = shuffled[np.lexsort((self.target_lengths[shuffled], self.source_lengths[shuffled]))]
        batches = np.split(order, np.cumsum(self.batch_sizes)[:-1])
        for batch in rng.permutation(len(batches)):
            yield batches[batch].tolist()


class TokenBudgetEpochCallback(TrainerCallback):
    """Tells the sampler which epoch begins. Trainer's own `set_epoch` calls do not reach a batch sampler that
    Accelerate wrapped twice (`SkipBatchSampler` around `BatchSamplerShard`, when a multi-process run resumes
    mid-epoch); this computes the epoch from the global step exactly as Trainer does when it resumes."""

    def __init__(self, sampler: TokenBudgetBatchSampler, gradient_accumulation_steps: int):
        self.sampler = sampler
        batches_per_rank = len(sampler) // sampler.num_replicas
        self.steps_per_epoch = max(math.ceil(batches_per_rank / gradient_accumulation_steps), 1)

    def on_epoch_begin(self, args, state, control, **kwargs):
        self.sampler.set_epoch(state.global_step // self.steps_per_epoch)


def pair_lengths(dataset) -> tuple[np.ndarray, np.ndarray]:
    """Token counts of each tokenised pair's source (`input_ids`) and target (`labels`), as arrays; computed with
    a batched, cached `datasets.map`."""
    lengths = dataset.map(
        lambda batch: {"source_length": [len(ids) for ids in batch["input_ids"]],
                       "target_length": [len(ids) for ids in batch["labels"]]},
        batched=True, remove_columns=dataset.column_names, desc="measuring pair lengths",
    ).with_format("numpy")
    return lengths["source_length"][:], lengths["target_length"][:]


def padding_statistics(batches, source_lengths, target_lengths) -> dict:
    """Real and padded token counts (source + target) of a list of batches of pair indices."""
    real = padded = 0
    for batch in batches:
        sources, targets = source_lengths[batch], target_lengths[batch]
        real += int(sources.sum() + targets.sum())
        padded += len(batch) * int(sources.max() + targets.max())
    return {"real_tokens": real, "padded_tokens": padded, "real_token_ratio": real / padded if padded else 1.0}
