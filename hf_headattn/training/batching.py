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

    By default pairs are sorted by source then target length over the whole training set and packed greedily in
    that order (fairseq's batches); ties (pairs of equal lengths) are broken by a shuffle drawn anew every epoch,
    and the batches come out in a shuffled order. The packing depends only on the lengths, so every epoch has the
    same number of batches (Trainer counts steps from `len()`), while the batches themselves differ little: a pair
    meets the same companions epoch after epoch.

    With `pool_pairs`, every epoch draws the pairs in a new random order and sorts and packs them only within
    consecutive pools of that many pairs (OpenNMT's pooled batches, Transformers' `group_by_length`): a pair's
    companions change every epoch, at the cost of some padding. The packing then differs between epochs, and so
    would the number of batches: every epoch is brought up to the count of the fullest of the first
    `COUNTED_EPOCHS` epochs by halving its largest batches, and a later epoch that would pack into more batches
    draws its order again (from the seed, the epoch and the attempt). Epochs are packed when they begin, so a run
    of any length starts at once, and its batches do not depend on how long it trains: a run extended by
    `--max_steps` resumes onto the batches it started with.

    Under several processes, Accelerate's `BatchSamplerShard` deals the batches out round-robin, so each rank
    trains on its own batches. The number of batches is made a multiple of `num_replicas` (by halving the
    largest batches) so that every rank takes the same number of steps and no batch is repeated.

    An epoch's batches depend only on `seed` and the epoch set with `set_epoch`, which is what makes a resumed
    run (Trainer skips the batches it already trained on) see the batches an uninterrupted run sees.
    """

    COUNTED_EPOCHS = 32  # pooled batches: the batch count is that of the fullest of these first epochs
    MAX_DRAWS = 100  # pooled batches: orders an epoch may draw to fit the batch count (one almost always does)

    def __init__(self, source_lengths, target_lengths, max_tokens: int, seed: int = 0, num_replicas: int = 1,
                 pool_pairs: int | None = None):
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
        if pool_pairs is not None and pool_pairs < 1:
            raise ValueError(f"--bucket_pool_pairs must be positive, got {pool_pairs}")
        self.max_tokens = max_tokens
        self.seed = seed
        self.num_replicas = num_replicas
        self.pool_pairs = pool_pairs
        self.epoch = 0
        if pool_pairs is None:
            order = np.lexsort((self.target_lengths, self.source_lengths))
            self.batch_sizes = self._pack(self.source_lengths[order], self.target_lengths[order])
            self.num_batches = self._round_up(len(self.batch_sizes))
            self._split_largest(self.batch_sizes, self.num_batches)
        else:
            fullest = max(len(self._pooled_packing(epoch)[1]) for epoch in range(self.COUNTED_EPOCHS))
            self.num_batches = self._round_up(fullest)

    def _round_up(self, count: int) -> int:
        return count + -count % self.num_replicas

    def _pack(self, source_lengths: np.ndarray, target_lengths: np.ndarray) -> list[int]:
        """Sizes of consecutive batches over pairs in length order, each within the budget."""
        sizes, count, longest_source, longest_target = [], 0, 0, 0
        for source_length, target_length in zip(source_lengths.tolist(), target_lengths.tolist()):
            longest_source, longest_target = max(longest_source, source_length), max(longest_target, target_length)
            if count and (count + 1) * (longest_source + longest_target) > self.max_tokens:
                sizes.append(count)
                count, longest_source, longest_target = 0, source_length, target_length
            count += 1
        sizes.append(count)
        return sizes

    def _split_largest(self, sizes: list[int], count: int) -> None:
        """Halve the largest batch (the first of equal ones; smaller half first) until there are `count`."""
        while len(sizes) < count:
            largest = int(np.argmax(sizes))
            if sizes[largest] < 2:
                raise ValueError(f"--max_tokens {self.max_tokens} leaves one pair per batch; the {len(sizes)} "
                                 f"batches cannot be split into {count}")
            half = sizes[largest] // 2
            sizes[largest : largest + 1] = [half, sizes[largest] - half]

    def _pooled_packing(self, epoch: int, draw: int = 0) -> tuple[np.ndarray, list[int]]:
        """This epoch's pair order (random pools, each sorted by length) and the sizes of its batches; `draw` > 0
        draws the order again."""
        stream = [self.seed, epoch] if draw == 0 else [self.seed, epoch, 2, draw]  # 1: the batches' order
        shuffled = np.random.default_rng(stream).permutation(len(self.source_lengths))
        pools, sizes = [], []
        for start in range(0, len(shuffled), self.pool_pairs):
            pool = shuffled[start : start + self.pool_pairs]
            pool = pool[np.lexsort((self.target_lengths[pool], self.source_lengths[pool]))]
            pools.append(pool)
            sizes += self._pack(self.source_lengths[pool], self.target_lengths[pool])
        return np.concatenate(pools), sizes

    def _pooled_epoch(self, epoch: int) -> tuple[np.ndarray, list[int]]:
        """The epoch's first packing that fits the batch count."""
        for draw in range(self.MAX_DRAWS):
            order, sizes = self._pooled_packing(epoch, draw)
            if len(sizes) <= self.num_batches:
                return order, sizes
        raise RuntimeError(f"epoch {epoch}: {self.MAX_DRAWS} orders of the pairs all pack into more than "
                           f"{self.num_batches} batches of --max_tokens {self.max_tokens}")

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return self.num_batches

    def __iter__(self):
        if self.pool_pairs is None:
            rng = np.random.default_rng([self.seed, self.epoch])
            shuffled = rng.permutation(len(self.source_lengths))
            # lexsort is stable: pairs of equal lengths keep this epoch's random order, and the length sequence
            # (hence the packing) is the same as in __init__
            order = shuffled[np.lexsort((self.target_lengths[shuffled], self.source_lengths[shuffled]))]
            sizes = self.batch_sizes
        else:
            order, sizes = self._pooled_epoch(self.epoch)
            self._split_largest(sizes, self.num_batches)
            rng = np.random.default_rng([self.seed, self.epoch, 1])  # the batches' order: a stream of its own
        batches = np.split(order, np.cumsum(sizes)[:-1])
        for batch in rng.permutation(len(batches)):
            yield batches[batch].tolist()


def optimizer_steps_per_epoch(sampler: TokenBudgetBatchSampler, gradient_accumulation_steps: int) -> int:
    """The optimizer steps each rank takes in an epoch of the sampler's batches, counted as Trainer counts them."""
    return max(math.ceil(len(sampler) // sampler.num_replicas / gradient_accumulation_steps), 1)


class TokenBudgetEpochCallback(TrainerCallback):
    """Tells the sampler which epoch begins. Trainer's own `set_epoch` calls do not reach a batch sampler that
    Accelerate wrapped twice (`SkipBatchSampler` around `BatchSamplerShard`, when a multi-process run resumes
    mid-epoch); this computes the epoch from the global step exactly as Trainer does when it resumes."""

    def __init__(self, sampler: TokenBudgetBatchSampler, gradient_accumulation_steps: int):
        self.sampler = sampler
        self.steps_per_epoch = optimizer_steps_per_epoch(sampler, gradient_accumulation_steps)

    def on_epoch_begin(self, args, state, control, **kwargs):
        self.sampler.set_epoch(state.global_step // self.steps_per_epoch)


def pair_lengths(dataset) -> tuple[np.ndarray, np.ndarray]:
    """Token counts of each tokenised pair's source (`input_ids`) and target (`labels`), as arrays, read from the
    Arrow list columns' offsets (no row is decoded into Python)."""
    import pyarrow.compute

    table = dataset.with_format("arrow")
    return tuple(pyarrow.compute.list_value_length(table[column]).to_numpy().astype(np.int64)
                 for column in ("input_ids", "labels"))


def padding_statistics(batches, source_lengths, target_lengths) -> dict:
    """Real and padded token counts (source + target) of a list of batches of pair indices."""
    real = padded = 0
    for batch in batches:
        sources, targets = source_lengths[batch], target_lengths[batch]
        real += int(sources.sum() + targets.sum())
        padded += len(batch) * int(sources.max() + targets.max())
    return {"real_tokens": real, "padded_tokens": padded, "real_token_ratio": real / padded if padded else 1.0}
