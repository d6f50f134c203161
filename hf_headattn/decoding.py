r"""The fast decoding path: greedy and beam search for this package's models that give the ids `generate` gives,
without its per-step overhead, and with finished sentences dropped from the batch.

`generate` steps a batch until its last sentence is done, so a batch of 32 sentences costs 32 rows (times the beam
size) at every step of its longest translation. Here finished sentences leave the batch: their rows leave the cache
(:meth:`Cache.batch_select_indices`, variant states included), the encoder outputs and the source mask, so later
steps cost only the sentences still being translated. Dropping rows copies every row that stays (its cache grows
with the step), so finished rows are dropped together, once the steps spent on them since the last drop match what
a drop costs (:meth:`RowDropPolicy.worth_dropping`); until then they are stepped along, their results stay as they
were the step they finished, and they are taken when their rows leave. The search itself is `generate`'s:

* the generation config is resolved by `generate`'s own preparation (`_prepare_generation_config`,
  `_prepare_special_tokens`, `_prepare_generated_length`), and logits are processed by the same
  `LogitsProcessorList` (`_get_logits_processor`), so `max_new_tokens`, `min_length`, `no_repeat_ngram_size`,
  `bad_words_ids`, forced tokens and the rest mean what they mean there;
* greedy search takes the argmax of the processed logits, as `generate`'s `_sample` does without sampling
  (through `max(dim).indices`: the same first index of the maximum, ~1.6x faster than `argmax` on a CPU);
* beam search calls `generate`'s own beam-search steps (`_get_running_beams_for_next_iteration`,
  `_update_finished_beams`, `_check_early_stop_heuristic`), one call per step for the whole batch, and reorders the
  cache with `reorder_cache` as `generate` does; its `_get_top_k_continuations` is rewritten here only to find the
  top-k on the CPU through chunk maxima (:func:`top_k`, torch.topk's values and indices, ties included, 4x faster);
* `min_length` and `min_new_tokens` suppress the end of sentence in place (:class:`SuppressEndBelowLength`) instead
  of through Transformers' processors, which copy the scores at every step.

A sentence is done once nothing can change its result any more: greedy, when it produced its end of sentence;
beam search, when `generate`'s early-stopping heuristic says no running hypothesis can beat its finished ones (it
then never touches that sentence's finished hypotheses again), or, with ``early_stopping=True``, when it has
``num_beams`` finished hypotheses. Every sentence's search depends only on its own rows, so the ids are those of
`generate` up to float rounding (a matrix product's rounding may depend on how many rows it has).

The model's side and the search's are apart: :class:`ModelStepper` holds the encoder outputs, the source mask and
the cache and steps the rows it is left; :class:`GreedySearch` and :class:`BeamSearch` keep their per-sentence
tensors in a :class:`RunningSentences`, which drops sentences from all of them at once and grows their token
buffers, and share one loop (:meth:`_Search.run`) that steps, applies :class:`RowDropPolicy` and takes the results
of finished sentences before their rows leave the stepper and the state together.

Sampling, and logits processors whose state spans the batch (classifier-free guidance, prefix constraints,
watermarking, ...), are not on the fast path: :func:`fast_path_refusal` names why, and the translation module then
calls `generate`.

The model's input checks run once per call: on the caller's source and mask, before they go to the device (the
encoder is called bare, so nothing else checks the source ids), and on the first step's inputs; later steps continue
the cache, which makes the model skip them, so no step reads a value on the host for them. The search reads one
number a step, as `generate` does: how many sentences are done (on a GPU each read waits for the device); which
ones, and their results, only when rows leave (and on the CPU, where a read waits for nothing, :func:`top_k` looks
for ties).

Tooling, not model runtime: never copied into a checkpoint.
"""

from __future__ import annotations

import logging
import math
import numbers
import time

import torch
from torch import nn
from transformers import GenerationConfig
from transformers.generation import logits_process

__all__ = ["FastPathUnsupported", "fast_generate", "fast_path_decodes", "fast_path_refusal", "fast_search",
           "generate_sequences", "resolve_generation_config", "search_sequences"]

logger = logging.getLogger(__name__)


class FastPathUnsupported(ValueError):
    """The options or the model ask for something the fast path does not decode; `generate` does."""

BEAM_BUFFER_COLUMNS = 32  # beam search's first token buffers, doubled when full
TOP_K_CHUNK = 32  # beam search's candidates are ranked in chunks of this many (see `top_k`)

# Processors that look at each row alone and keep no state across rows: a row's scores do not change when other
# rows leave the batch.
ROW_WISE_PROCESSORS = tuple(getattr(logits_process, name) for name in (
    "MinLengthLogitsProcessor", "MinNewTokensLengthLogitsProcessor", "NoRepeatNGramLogitsProcessor",
    "NoBadWordsLogitsProcessor", "SequenceBiasLogitsProcessor", "ForcedBOSTokenLogitsProcessor",
    "ForcedEOSTokenLogitsProcessor", "RepetitionPenaltyLogitsProcessor", "SuppressTokensLogitsProcessor",
    "SuppressTokensAtBeginLogitsProcessor", "InfNanRemoveLogitsProcessor", "LogitNormalization",
    "ExponentialDecayLengthPenalty",
) if hasattr(logits_process, name))


# What the models' own generate refuses (`runtime.seq2seq_common.check_generation_counts`, which this module may not
# import: the web page's code, which travels into Spaces, imports this one), refused here too, with the same words,
# for every saved model version the fast path steps
GENERATION_COUNTS = {
    "num_beams": "1: greedy search or sampling; more: beam search",
    "num_return_sequences": "sequences returned per input, at most num_beams",
}


class SuppressEndBelowLength:
    """`MinLengthLogitsProcessor` and `MinNewTokensLengthLogitsProcessor` in place: the end-of-sentence scores set
    to -inf while the rows are shorter than `min_length` (prompt included). Transformers' processors copy the whole
    [rows, vocab] scores at every step, the minimum reached or not (a sixth of a beam-5 step on the CPU when every
    sentence is held to a fixed length); the search owns its scores, so they are changed where they are."""

    def __init__(self, min_length: int, eos_token_id: torch.Tensor):
        self.min_length = min_length
        self.eos_ids = [int(token) for token in eos_token_id.reshape(-1).tolist()]  # read once per search
        self.columns = None  # the end-of-sentence columns the scores have, on their device (built on first use)

    @classmethod
    def replacing(cls, processor):
        """The in-place equivalent of `processor`, or `processor` itself where it is neither of the two."""
        if type(processor) is logits_process.MinLengthLogitsProcessor:
            return cls(processor.min_length, processor.eos_token_id)
        if type(processor) is logits_process.MinNewTokensLengthLogitsProcessor:
            return cls(processor.prompt_length_to_skip + processor.min_new_tokens, processor.eos_token_id)
        return processor

    def __call__(self, input_ids: torch.LongTensor, scores: torch.Tensor) -> torch.Tensor:
        if input_ids.shape[-1] < self.min_length:
            if self.columns is None or self.columns.device != scores.device:
                self.columns = torch.tensor([token for token in self.eos_ids if 0 <= token < scores.shape[-1]],
                                            dtype=torch.long, device=scores.device)
            scores.index_fill_(-1, self.columns, -math.inf)
        return scores


def top_k(scores: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """`torch.topk(scores, k)` of [rows, n] scores (sorted, largest first), on the CPU through chunk maxima: the k + 1
    best values lie in the k + 1 chunks with the best maxima (a chunk holding one of them has at most k chunks above
    it, or ties with them), so one pass over the scores for the chunks' maxima and a top-k over (k + 1) * `chunk`
    candidates replace the top-k over all of them (beam search's candidates: beams x vocabulary; 4x faster on the CPU
    at 5 x 8,000). Where those k + 1 values are all distinct, the k best and their order are torch.topk's. A row with
    a tie among them (sums of log-probabilities tie often in float32) is taken from torch.topk itself, whose order of
    equal values is its own; checking for one reads a value on the host, so on other devices this is torch.topk."""
    rows, n, chunk = *scores.shape, TOP_K_CHUNK
    if n < 4 * (k + 1) * chunk or scores.device.type != "cpu":
        return torch.topk(scores, k)
    padded = scores if n % chunk == 0 else nn.functional.pad(scores, (0, -n % chunk), value=-math.inf)
    padded = padded.view(rows, -1, chunk)
    best_chunks = padded.amax(dim=-1).topk(k + 1).indices  # [rows, k + 1]
    candidates = padded.gather(1, best_chunks[:, :, None].expand(-1, -1, chunk)).view(rows, -1)
    values, positions = candidates.topk(k + 1)
    indices = best_chunks.gather(1, positions // chunk) * chunk + positions % chunk
    tied = ~(values[:, :-1] > values[:, 1:]).all(dim=-1)  # NaN compares as a tie
    values, indices = values[:, :k].contiguous(), indices[:, :k].contiguous()  # as torch.topk's
    if tied.any():
        tied_rows = tied.nonzero().flatten()
        exact = torch.topk(scores[tied_rows], k)
        values[tied_rows], indices[tied_rows] = exact.values, exact.indices
    return values, indices


def check_generation_counts(model, generate_kwargs: dict) -> None:
    """ValueError naming `num_beams` or `num_return_sequences` when it is not a whole number >= 1 (in the call's
    arguments, else its `generation_config=`, else the model's): Transformers' generate divides by them."""
    config = generate_kwargs.get("generation_config") or model.generation_config
    for name, meaning in GENERATION_COUNTS.items():
        value = generate_kwargs[name] if generate_kwargs.get(name) is not None else getattr(config, name, None)
        if value is not None and (isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1):
            raise ValueError(f"`{name}` must be a whole number >= 1 ({meaning}), got {value!r}")


def resolve_generation_config(model, **generate_kwargs) -> tuple[GenerationConfig, dict]:
    """(generation config, leftover model kwargs) as `generate` resolves them from the model's generation config
    and the call's keyword arguments (lengths not yet turned into totals)."""
    return model._prepare_generation_config(None, **generate_kwargs)


def fast_path_refusal(model, generation_config: GenerationConfig, model_kwargs: dict | None = None) -> str | None:
    """Why `generate` must decode instead of :func:`fast_generate` (None: the fast path gives its ids)."""
    # the path steps this package's models (both families' models check their inputs once per call: `check_inputs`,
    # saved folders of every version included), whose caches drop rows and whose forward takes encoder outputs
    if not callable(getattr(model, "check_inputs", None)):
        return f"a {type(model).__name__} (the fast path steps this package's models)"
    if model_kwargs:
        return f"generate arguments it does not take: {', '.join(sorted(model_kwargs))}"
    if generation_config.do_sample:
        return "sampling (do_sample=True)"
    if (generation_config.num_beam_groups or 1) > 1:
        return "group beam search (num_beam_groups > 1)"
    if generation_config.num_return_sequences and generation_config.num_return_sequences > generation_config.num_beams:
        return "more returned sequences than beams"
    if not generation_config.use_cache:
        return "use_cache=False"
    for name in ("guidance_scale", "watermarking_config", "assistant_early_exit", "prompt_lookup_num_tokens",
                 "stop_strings", "penalty_alpha", "constraints", "force_words_ids"):
        value = getattr(generation_config, name, None)
        if value is not None and not (name == "guidance_scale" and value == 1):
            return f"generation option {name}={value!r}"
    return None


def fast_path_decodes(model, **generate_kwargs) -> bool:
    """Whether :func:`fast_search` decodes `model` with these `generate` options (else `generate` does):
    :func:`fast_path_refusal` of the generation config they resolve to."""
    return fast_path_refusal(model, *resolve_generation_config(model, **generate_kwargs)) is None


def fast_generate(model, input_ids: torch.LongTensor, attention_mask: torch.Tensor | None = None,
                  **generate_kwargs) -> torch.LongTensor:
    """`model.generate(input_ids, attention_mask=attention_mask, **generate_kwargs)`'s sequences (greedy or beam
    search; `num_return_sequences` per sentence, best first), from the fast path: [batch * returned, length],
    starting with the decoder start token, filled after a sequence's end as `generate` fills it (greedy search: the
    pad token; beam search: the pad token, or the end of sentence where the pad id is 0).

    Raises:
        FastPathUnsupported: options the fast path does not decode (:func:`fast_path_refusal`, logits processors
            whose state spans the batch); `generate` decodes them (:func:`generate_sequences` falls back to it).
    """
    return fast_search(model, input_ids, attention_mask, **generate_kwargs)[0]


def fast_search(model, input_ids: torch.LongTensor, attention_mask: torch.Tensor | None = None,
                **generate_kwargs) -> tuple[torch.LongTensor, torch.Tensor | None]:
    """(:func:`fast_generate`'s sequences, and for beam search their scores: `generate`'s ``sequences_scores``,
    the length-penalised log-probabilities the search ranked them by; None for greedy search)."""
    started = time.time()  # max_time counts from here, as generate's MaxTimeCriteria does from its creation
    check_generation_counts(model, generate_kwargs)  # as the models' generate checks them
    generation_config, model_kwargs = resolve_generation_config(model, **generate_kwargs)
    refusal = fast_path_refusal(model, generation_config, model_kwargs)
    if refusal:
        raise FastPathUnsupported(f"The fast decoding path does not decode {refusal}")
    has_default_max_length = (generate_kwargs.get("max_length") is None
                              and model.generation_config.max_length is None)
    has_default_min_length = (generate_kwargs.get("min_length") is None
                              and model.generation_config.min_length is None)
    device = model.device
    model.check_inputs(input_ids=input_ids, attention_mask=attention_mask)  # as generate does, on the host's tensors
    input_ids = input_ids.to(device)
    attention_mask = torch.ones_like(input_ids) if attention_mask is None else attention_mask.to(device)
    model._prepare_special_tokens(generation_config, True, device=device, batch_size=input_ids.shape[0])
    generation_config = model._prepare_generated_length(
        generation_config, has_default_max_length=has_default_max_length,
        has_default_min_length=has_default_min_length, model_input_name="input_ids", input_ids_length=1,
        inputs_tensor=input_ids)
    if generation_config.max_length <= 1:  # generate's own refusal (`_validate_generated_length`), word for word
        raise ValueError(f"Input length of decoder_input_ids is 1, but `max_length` is set to "
                         f"{generation_config.max_length}. This can lead to unexpected behavior. You should consider "
                         "increasing `max_length` or, better yet, setting `max_new_tokens`.")
    processors = model._get_logits_processor(generation_config=generation_config, input_ids_seq_length=1,
                                             encoder_input_ids=input_ids, device=device, model_kwargs={})
    batch_wide = [type(processor).__name__ for processor in processors
                  if not isinstance(processor, ROW_WISE_PROCESSORS)]
    if batch_wide:
        raise FastPathUnsupported(f"The fast decoding path does not decode with logits processors "
                                  f"{', '.join(batch_wide)}")
    processors = logits_process.LogitsProcessorList(SuppressEndBelowLength.replacing(processor)
                                                    for processor in processors)
    with torch.inference_mode():
        encoder_outputs = model.get_encoder()(input_ids=input_ids, attention_mask=attention_mask, return_dict=True)
        stepper = ModelStepper(model, encoder_outputs, attention_mask)
        search = GreedySearch if generation_config.num_beams == 1 else BeamSearch
        return search(stepper, generation_config, processors, started).run()


class ModelStepper:
    """The model's side of a search: the rows still decoded, stepped one token at a time, with their encoder
    outputs, source mask and cache, which leave, repeat and reorder with the rows."""

    def __init__(self, model, encoder_outputs, attention_mask: torch.Tensor):
        self.model = model
        self.encoder_outputs = encoder_outputs
        self.attention_mask = attention_mask
        self.cache = None  # built by the first step

    def next_token_logits(self, tokens: torch.LongTensor) -> torch.Tensor:
        """float32 logits [rows, vocab] of the next token after `tokens` [rows], the rows' cache extended."""
        outputs = self.model(encoder_outputs=self.encoder_outputs, attention_mask=self.attention_mask,
                             decoder_input_ids=tokens[:, None], cache=self.cache, use_cache=True, return_dict=True)
        self.cache = outputs["cache" if "cache" in outputs else "past_key_values"]  # the release's name for it
        return outputs.logits[:, -1, :].to(dtype=torch.float32)

    def keep_rows(self, rows: torch.Tensor) -> None:
        """Only `rows` (indices into the current rows) go on: drop the others from the cache and the inputs."""
        self.cache.batch_select_indices(rows)
        self._map_inputs(lambda tensor: tensor[rows])

    def repeat_rows(self, repeats: int) -> None:
        """Each row becomes `repeats` equal rows, in the cache and the inputs."""
        self.cache.batch_repeat_interleave(repeats)
        self._map_inputs(lambda tensor: tensor.repeat_interleave(repeats, dim=0))

    def reorder_rows(self, rows: torch.Tensor) -> None:
        """Row i's cache becomes row `rows[i]`'s (beam search's beam indices, each among its sentence's own rows,
        whose inputs are the same, so only the cache moves)."""
        self.cache.reorder_cache(rows)

    def _map_inputs(self, rows_of) -> None:
        self.attention_mask = rows_of(self.attention_mask)
        self.encoder_outputs = type(self.encoder_outputs)(**{
            name: rows_of(value) if torch.is_tensor(value) else value for name, value in self.encoder_outputs.items()})


class RowDropPolicy:
    """When finished sentences' rows leave the batch: together, once the steps spent on them pay for a drop."""

    def __init__(self):
        self.finished_row_steps = 0  # steps spent on finished rows since they were last dropped

    def worth_dropping(self, finished_rows: int, rows: int) -> bool:
        """Whether to drop the `finished_rows` of the `rows` now; called once a step, each call counting the step
        every finished row costs if it stays.

        A drop copies the cache and inputs of every row that stays, about half a row's decoding step each
        (profiled on 2 Xeon cores with a 256 x 3 Transformer: the copy grows with the cache, as the attention
        does); keeping a finished row costs a row's step at every later step. So they are dropped once the steps
        counted for finished rows since the last drop reach half the rows that stay: a ski-rental rule, within
        twice the cheaper of dropping at once and never."""
        self.finished_row_steps += finished_rows
        return finished_rows > 0 and self.finished_row_steps >= (rows - finished_rows) / 2

    def dropped(self) -> None:
        """The finished rows left: the steps spent on finished rows count from 0 again."""
        self.finished_row_steps = 0


class RunningSentences:
    """A search's tensors with one entry per sentence still searched (dim 0), as attributes: `sentence` (each
    entry's sentence in the batch) and those it is built with. Sentences leave all of them at once (:meth:`keep`);
    token buffers grow at their end (:meth:`grow`)."""

    def __init__(self, batch: int, device: torch.device, **per_sentence: torch.Tensor):
        self.sentence = torch.arange(batch, device=device)
        vars(self).update(per_sentence)
        self.names = ("sentence", *per_sentence)

    def keep(self, kept: torch.Tensor) -> None:
        """Only the sentences at `kept` (indices into the current ones) go on, in every tensor."""
        for name in self.names:
            setattr(self, name, getattr(self, name)[kept])

    def grow(self, columns: int, fills: dict[str, int]) -> None:
        """`columns` more columns at the end of the tensors `fills` names, each filled with its value there."""
        for name, fill in fills.items():
            setattr(self, name, nn.functional.pad(getattr(self, name), (0, columns), value=fill))


class _Search:
    """What greedy and beam search share: the lengths, end tokens and clock of the generation config, each
    sentence's results, and the loop (:meth:`run`) that steps the search and drops finished sentences' rows under
    one cost rule (:class:`RowDropPolicy`). A search's `step` advances every running hypothesis by one token and says
    which sentences are done; `take` records the results of some of them before their rows leave."""

    beams = 1  # rows per sentence
    state: RunningSentences  # built by each search

    def __init__(self, stepper: ModelStepper, generation_config: GenerationConfig, processors, started: float, *,
                 fill: int, returned: int = 1, scored: bool = False):
        self.stepper = stepper
        self.processors = processors
        self.max_length = generation_config.max_length
        self.eos = generation_config._eos_token_tensor
        self.start = int(generation_config._decoder_start_token_tensor.reshape(-1)[0])
        self.deadline = None if generation_config.max_time is None else started + generation_config.max_time
        self.fill = fill  # what follows a sequence's end
        self.drops = RowDropPolicy()
        self.length = 1  # every running hypothesis' tokens, the start token included
        self.batch_size, self.device = stepper.attention_mask.shape[0], stepper.attention_mask.device
        # each sentence's returned sequences, their lengths (and scores), taken when its rows leave; written in
        # tensors, not sliced out row by row: on a GPU every operation is a launch, and the search's pace is the
        # launches'
        self.results = torch.full((self.batch_size, returned, self.max_length), fill, dtype=torch.long,
                                  device=self.device)
        self.result_lengths = torch.zeros((self.batch_size, returned), dtype=torch.long, device=self.device)
        self.result_scores = torch.zeros((self.batch_size, returned), device=self.device) if scored else None

    def run(self) -> tuple[torch.LongTensor, torch.Tensor | None]:
        """Each sentence's returned sequences [batch * returned, length] and, for beam search, their scores."""
        while True:
            done = self.step()  # per running sentence, nonzero once it is done
            sentences, finished = done.numel(), int(done.count_nonzero())  # the step's one read on the host
            if finished < sentences and not self.drops.worth_dropping(finished * self.beams, sentences * self.beams):
                continue
            taken = done.nonzero().flatten() if finished < sentences else torch.arange(sentences, device=self.device)
            self.take(taken)
            if finished == sentences:
                return self.collected()
            kept = (done == 0).nonzero().flatten()
            self.stepper.keep_rows(self.rows_of(kept))
            self.state.keep(kept)
            self.drops.dropped()

    def step(self) -> torch.Tensor:
        raise NotImplementedError

    def take(self, taken: torch.Tensor) -> None:
        raise NotImplementedError

    def rows_of(self, sentences: torch.Tensor) -> torch.Tensor:
        """The stepper's rows of the running `sentences` (indices)."""
        return sentences

    def record(self, taken: torch.Tensor, sequences: torch.Tensor, lengths: torch.Tensor,
               scores: torch.Tensor | None = None) -> None:
        """The results of the running sentences at `taken`: their [taken, returned, length] `sequences` (filled
        from `lengths` [taken, returned] on) and, for beam search, their `scores`."""
        sentences = self.state.sentence[taken]
        self.results[:, :, :sequences.shape[-1]].index_copy_(
            0, sentences, self.padded_after(sequences, lengths, self.fill))
        self.result_lengths.index_copy_(0, sentences, lengths)
        if scores is not None:
            self.result_scores.index_copy_(0, sentences, scores)

    def collected(self) -> tuple[torch.LongTensor, torch.Tensor | None]:
        """The results once every sentence is done, cut to the longest (the search's last read on the host)."""
        sequences = self.results[:, :, :int(self.result_lengths.max())].flatten(0, 1).contiguous()
        return sequences, None if self.result_scores is None else self.result_scores.flatten()

    def out_of_time(self) -> bool:
        """`max_time` is over: generate's MaxTimeCriteria then ends every sequence at this step."""
        return self.deadline is not None and time.time() > self.deadline

    def ends(self, tokens: torch.Tensor) -> torch.Tensor:
        return torch.isin(tokens, self.eos)

    @staticmethod
    def padded_after(sequences: torch.Tensor, lengths: torch.Tensor, fill: int) -> torch.Tensor:
        """[..., length] `sequences` with `fill` from each one's length on (`lengths`: [...])."""
        positions = torch.arange(sequences.shape[-1], device=sequences.device)
        return sequences.masked_fill(positions >= lengths[..., None], fill)


class GreedySearch(_Search):
    """generate's `_sample` without sampling: each row's next token is the argmax of its processed logits (through
    `max(dim).indices`: the same first index of the maximum, ~1.6x faster than `argmax` on a CPU)."""

    def __init__(self, stepper: ModelStepper, generation_config: GenerationConfig, processors, started: float):
        super().__init__(stepper, generation_config, processors, started,
                         fill=int(generation_config._pad_token_tensor))
        running = torch.full((self.batch_size, self.max_length), self.fill, dtype=torch.long, device=self.device)
        running[:, 0] = self.start
        # each row's length when its sentence was done (0: not done); its tokens up to there stay as they were
        done_length = torch.zeros(self.batch_size, dtype=torch.long, device=self.device)
        self.state = RunningSentences(self.batch_size, self.device, running=running, done_length=done_length)

    def step(self) -> torch.Tensor:
        running, done_length, length = self.state.running, self.state.done_length, self.length
        scores = self.processors(running[:, :length], self.stepper.next_token_logits(running[:, length - 1]))
        running[:, length] = scores.max(dim=-1).indices
        self.length = length = length + 1
        done = self.ends(running[:, length - 1]) | (length >= self.max_length) | self.out_of_time()
        done_length.masked_fill_(done & (done_length == 0), length)
        return done_length

    def take(self, taken: torch.Tensor) -> None:
        lengths = self.state.done_length[taken]
        self.record(taken, self.state.running[taken].unsqueeze(1), lengths.unsqueeze(1))


class BeamSearch(_Search):
    """generate's `_beam_search`, through its own steps (`_get_running_beams_for_next_iteration`,
    `_update_finished_beams`, `_check_early_stop_heuristic`), one call per step for the whole batch, with the cache
    reordered by the beam indices as generate reorders it."""

    def __init__(self, stepper: ModelStepper, generation_config: GenerationConfig, processors, started: float):
        pad = int(generation_config._pad_token_tensor)
        self.returned = generation_config.num_return_sequences or 1
        # what generate's beam search writes after a hypothesis' end: its `output_fill_value`, `pad_token_id or
        # eos_token_id[0]`, so the end of sentence where the pad id is 0
        super().__init__(stepper, generation_config, processors, started, returned=self.returned, scored=True,
                         fill=pad or int(generation_config._eos_token_tensor.reshape(-1)[0]))
        self.model = stepper.model  # whose methods are generate's beam-search steps
        self.beams = generation_config.num_beams
        self.early_stopping, self.length_penalty = generation_config.early_stopping, generation_config.length_penalty
        self.beams_to_keep = max(2, 1 + self.eos.shape[0]) * self.beams
        self.top_num_beam_mask = torch.arange(self.beams_to_keep, device=self.device) < self.beams
        self.state = self.first_hypotheses()

    def first_hypotheses(self) -> RunningSentences:
        """Each sentence's beams: the start token, the first beam's continuations the only ones that count."""
        batch, beams, device = self.batch_size, self.beams, self.device
        # The token and beam-index buffers grow with the hypotheses (generate allocates max_length columns): each
        # step's top-k gathers and merges copy them whole, so their width is paid at every step.
        capacity = min(self.max_length, BEAM_BUFFER_COLUMNS)
        running = torch.full((batch, beams, capacity), self.fill, dtype=torch.long, device=device)
        running[:, :, 0] = self.start
        running_scores = torch.zeros((batch, beams), device=device)
        running_scores[:, 1:] = -1e9  # the beams start equal: only the first one's continuations count
        running_indices = torch.full((batch, beams, capacity - 1), -1, dtype=torch.int32, device=device)
        return RunningSentences(
            batch, device, running=running, finished=running.clone(), running_scores=running_scores,
            finished_scores=torch.full((batch, beams), -1e9, device=device),
            is_finished=torch.zeros((batch, beams), dtype=torch.bool, device=device),
            can_improve=torch.ones((batch, 1), dtype=torch.bool, device=device),
            running_indices=running_indices, finished_indices=running_indices.clone(),
            recorded=torch.zeros(batch, dtype=torch.bool, device=device))  # the sentences that are done

    def step(self) -> torch.Tensor:
        state, length = self.state, self.length
        if length == state.running.shape[-1]:  # this step writes column `length`: make room, up to max_length
            state.grow(min(length, self.max_length - length),
                       dict(running=self.fill, finished=self.fill, running_indices=-1, finished_indices=-1))
        top_log_probs, top_sequences, top_indices = self.top_k_continuations(self.continuation_log_probs())
        hits_stop = self.ends(top_sequences[:, :, length]) | (length + 1 >= self.max_length) | self.out_of_time()
        self.update_beams(top_log_probs, top_sequences, top_indices, hits_stop)
        # the rows of each sentence's next hypotheses come from its own rows: generate's beam indices
        self.stepper.reorder_rows(state.running_indices[:, :, length - 1].reshape(-1).long())
        self.length = length = length + 1
        state.can_improve = self.model._check_early_stop_heuristic(
            is_early_stop_heuristic_unsatisfied=state.can_improve, running_beam_scores=state.running_scores,
            beam_scores=state.finished_scores, is_sent_finished=state.is_finished, cur_len=length,
            max_length=self.max_length, decoder_prompt_len=1, early_stopping=self.early_stopping,
            length_penalty=self.length_penalty)
        # A done sentence stays done, and its finished hypotheses as they are: the heuristic's flags only fall,
        # and finished hypotheses only fill up. So its results are taken when its rows leave or the search ends.
        # generate stops once every continuation ends (max_length, max_time).
        state.recorded |= (~state.can_improve[:, 0] | (state.is_finished.all(dim=-1) & (self.early_stopping is True))
                           | hits_stop.all())
        return state.recorded

    def continuation_log_probs(self) -> torch.Tensor:
        """[sentences, beams * vocab] log-probabilities of every running hypothesis' continuations, processed."""
        running, length = self.state.running, self.length
        sentences, beams = running.shape[:2]
        flat = running[:, :, :length].reshape(sentences * beams, length)
        if length == 1:
            # A sentence's beams all start from the start token: step once per sentence, then give each beam
            # a copy of that step's cache rows (generate steps every beam row, to the same values).
            logits = self.stepper.next_token_logits(flat[::beams, -1]).repeat_interleave(beams, dim=0)
            self.stepper.repeat_rows(beams)
        else:
            logits = self.stepper.next_token_logits(flat[:, -1])
        # In place: the [rows, vocab] scores are the step's largest tensors, and writing them into fresh memory
        # costs more than computing them (a 640 x 8,000 log-softmax: ~4x, on one Xeon core). The values are
        # generate's: the same kernels, in the same order.
        log_probs = self.processors(flat, torch.log_softmax(logits, dim=-1, out=logits))
        return log_probs.view(sentences, beams, -1).add_(self.state.running_scores[:, :, None]).view(sentences, -1)

    def top_k_continuations(self, log_probs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """generate's `_get_top_k_continuations` without sampling (its decoder prompt: the start token), with the
        top-k of :func:`top_k`: the `beams_to_keep` best continuations of each sentence's [beams * vocab] scores,
        their sequences (the new token written at `length`) and beam indices (the sentence's offset added)."""
        running, length = self.state.running, self.length
        sentences, beams = running.shape[:2]
        top_log_probs, top_positions = top_k(log_probs, self.beams_to_keep)
        vocab_size = log_probs.shape[-1] // beams
        beam = top_positions // vocab_size
        top_indices = self.model._gather_beams(self.state.running_indices, beam)
        top_sequences = self.model._gather_beams(running, beam)
        top_sequences[:, :, length] = top_positions % vocab_size
        top_indices[:, :, length - 1] = beam + torch.arange(sentences, device=beam.device)[:, None] * beams
        return top_log_probs, top_sequences, top_indices

    def update_beams(self, top_log_probs: torch.Tensor, top_sequences: torch.Tensor, top_indices: torch.Tensor,
                     hits_stop: torch.Tensor) -> None:
        """generate's next running beams and finished hypotheses from the step's top continuations."""
        state = self.state
        state.running, state.running_scores, state.running_indices = self.model._get_running_beams_for_next_iteration(
            topk_log_probs=top_log_probs, topk_running_sequences=top_sequences,
            topk_running_beam_indices=top_indices, next_token_hits_stopping_criteria=hits_stop, num_beams=self.beams)
        state.finished, state.finished_scores, state.finished_indices, state.is_finished = \
            self.model._update_finished_beams(
                sequences=state.finished, topk_running_sequences=top_sequences, beam_scores=state.finished_scores,
                topk_log_probs=top_log_probs, beam_indices=state.finished_indices,
                topk_running_beam_indices=top_indices, is_early_stop_heuristic_unsatisfied=state.can_improve,
                is_sent_finished=state.is_finished, next_token_hits_stopping_criteria=hits_stop,
                top_num_beam_mask=self.top_num_beam_mask, num_beams=self.beams, cur_len=self.length,
                decoder_prompt_len=1, length_penalty=self.length_penalty, early_stopping=self.early_stopping)

    def take(self, taken: torch.Tensor) -> None:
        state, returned = self.state, self.returned
        # a hypothesis' generated length: its steps' beam indices (generate crops its output by them too)
        lengths = 1 + (state.finished_indices[taken, :returned] >= 0).sum(dim=-1)
        self.record(taken, state.finished[taken, :returned], lengths, state.finished_scores[taken, :returned])

    def rows_of(self, sentences: torch.Tensor) -> torch.Tensor:
        return (sentences[:, None] * self.beams + torch.arange(self.beams, device=sentences.device)).reshape(-1)


def generate_sequences(model, input_ids: torch.LongTensor, attention_mask: torch.Tensor | None = None, *,
                       fast: bool = True, **generate_kwargs) -> torch.LongTensor:
    """The sequences `model.generate` returns, from :func:`fast_generate` where it decodes these options (with
    `fast`), else from `generate` itself (the reason logged at INFO)."""
    return search_sequences(model, input_ids, attention_mask, fast=fast, scores=False, **generate_kwargs)[0]


def search_sequences(model, input_ids: torch.LongTensor, attention_mask: torch.Tensor | None = None, *,
                     fast: bool = True, scores: bool = True,
                     **generate_kwargs) -> tuple[torch.LongTensor, torch.Tensor | None]:
    """(:func:`generate_sequences`'s sequences, and with `scores`, for beam search, the scores the search ranked
    them by, as `generate`'s ``sequences_scores``: what n-best lists show, without scoring the hypotheses again;
    None for greedy search and sampling, or without `scores`)."""
    if fast:
        try:
            sequences, sequence_scores = fast_search(model, input_ids, attention_mask, **generate_kwargs)
            return sequences, sequence_scores if scores else None
        except FastPathUnsupported as reason:
            logger.info(f"{reason}; decoding with model.generate")
    with torch.inference_mode():
        if not scores:
            return model.generate(input_ids=input_ids, attention_mask=attention_mask, **generate_kwargs), None
        output = model.generate(input_ids=input_ids, attention_mask=attention_mask, return_dict_in_generate=True,
                                output_scores=True, **generate_kwargs)
    return output.sequences, getattr(output, "sequences_scores", None)
