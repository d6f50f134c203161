"""The fast decoding path (hf_headattn.decoding) gives the ids of `generate` for every variant of both families,
greedy and beam search, n-best included; a padded batch gives what each sentence gives alone; options it does not
decode go to `generate`."""

import functools

import pytest
import torch

from hf_headattn import decoding
from hf_headattn.decoding import FastPathUnsupported, fast_generate, generate_sequences, top_k

from helpers import (EOS, RNN_CONFIGS, RNN_EOS_BIAS, VARIANT_CONFIGS, random_model, random_rnn_model, rnn_config,
                     source_batch, tiny_config)

LENGTHS = (7, 4, 9, 3, 8, 5)  # six sentences, so that some finish (and leave the batch) while others go on
# Random models fall into repeating one token; forbidding repeats makes every step's argmax matter.
NO_REPEAT = dict(no_repeat_ngram_size=1)
SEARCHES = {
    "greedy": dict(num_beams=1, **NO_REPEAT),
    "beam-5": dict(num_beams=5, **NO_REPEAT),
    "beam-5-3-best": dict(num_beams=5, num_return_sequences=3, **NO_REPEAT),
    "beam-4-length-penalty-no-repeated-bigrams": dict(num_beams=4, length_penalty=0.5, no_repeat_ngram_size=2),
    "beam-3-early-stopping": dict(num_beams=3, early_stopping=True, **NO_REPEAT),
    "beam-3-never-stopping-early": dict(num_beams=3, early_stopping="never", **NO_REPEAT),
    "beam-3-repeats-allowed": dict(num_beams=3),
    "greedy-min-length": dict(num_beams=1, min_length=5, **NO_REPEAT),
    "beam-4-min-new-tokens": dict(num_beams=4, min_new_tokens=4, **NO_REPEAT),
}


def models():
    for name, config in sorted(VARIANT_CONFIGS.items()):
        yield f"transformer-{name}", lambda config=config: random_model(tiny_config(**config))
    for name, config in RNN_CONFIGS.items():
        yield f"lstm-{name}", lambda name=name, config=config: random_rnn_model(
            rnn_config(**config), eos_bias=RNN_EOS_BIAS.get(name, 0.0))


MODELS = dict(models())
# Added to each random model's end-of-sentence logit so that its translations end at many lengths (found by a scan
# of -4..14 in steps of 0.25 for the most distinct lengths), so that sentences leave the batch at different steps.
EOS_BIASES = {
    "lstm-2-encoder-3-decoder-layers": -0.5, "lstm-2x1-single-hop": -0.75, "lstm-2x2-dependent": -1.0,
    "lstm-2x3-independent": -0.5, "lstm-baseline-1x1-general": -0.5, "lstm-coverage-vector": -0.75,
    "lstm-csoftmax-constant": -0.25, "lstm-csparsemax-guided": 0.0, "lstm-csparsemax-sink-vector": -0.5, "lstm-softmax-sink-token-2x2": 0.0, "lstm-csparsemax-predicted-no-sink": -0.25,
    "lstm-dot": 0.0, "lstm-scaled-general-csparsemax": 1.75, "lstm-sparsemax": -0.5,
    "transformer-csoftmax-constant": 2.5, "transformer-csparsemax-guided": 0.75,
    "transformer-csparsemax-predicted-no-sink": 2.25, "transformer-dhicm-every-layer-and-site": 2.75,
    "transformer-dhicm-pruned": 1.25, "transformer-entmax15-every-site": 6.75,
    "transformer-entmax_alpha-learned-and-fixed": -0.75, "transformer-mma": 6.5, "transformer-mma-no-positions": 6.0,
    "transformer-multihop-dependent-2-hops": -1.25, "transformer-multihop-independent": -1.25,
    "transformer-running_sum": 6.5, "transformer-softmax-every-site": 6.25, "transformer-sparsemax-every-site": 7.0,
}


def output_lengths(model) -> set[int]:
    input_ids, attention_mask = source_batch(LENGTHS)
    return {len(ids) for num_beams in (1, 5)
            for ids in up_to_end(fast_generate(model, input_ids, attention_mask, num_beams=num_beams,
                                               max_new_tokens=20, **NO_REPEAT))}


def add_eos_bias(model, bias: float) -> None:
    with torch.no_grad():
        if hasattr(model, "final_logits_bias"):
            model.final_logits_bias[0, EOS] += bias
        else:
            model.generator.bias[EOS] += bias


@functools.cache
def eos_bias(name: str) -> float:
    """`EOS_BIASES`' bias for the model `name`, or, for one it does not list (a variant registered since), the bias
    of a scan (the table's, in steps of 0.5) under which its translations end at the most lengths."""
    if name in EOS_BIASES:
        return EOS_BIASES[name]

    def lengths_under(bias: float) -> int:
        model = MODELS[name]()
        add_eos_bias(model, bias)
        return len(output_lengths(model))

    return max((step / 2 for step in range(-8, 29)), key=lengths_under)


@pytest.fixture(scope="module", params=sorted(MODELS))
def model(request):
    model = MODELS[request.param]()
    add_eos_bias(model, eos_bias(request.param))
    return model


def up_to_end(sequences: torch.Tensor) -> list[list[int]]:
    """Each sequence's generated ids up to and including its first EOS (what its translation is made of)."""
    result = []
    for sequence in sequences[:, 1:].tolist():
        result.append(sequence[: sequence.index(EOS) + 1] if EOS in sequence else sequence)
    return result


@pytest.mark.parametrize("max_new_tokens", [6, 20])
@pytest.mark.parametrize("search", sorted(SEARCHES))
def test_fast_path_gives_the_ids_of_generate(model, search, max_new_tokens):
    input_ids, attention_mask = source_batch(LENGTHS)
    options = dict(max_new_tokens=max_new_tokens, **SEARCHES[search])
    with torch.inference_mode():
        expected = model.generate(input_ids=input_ids, attention_mask=attention_mask, **options)
    fast = fast_generate(model, input_ids, attention_mask, **options)
    assert up_to_end(fast) == up_to_end(expected)
    assert torch.equal(fast, expected) and fast.is_contiguous()  # padded after the end as generate pads


@pytest.mark.parametrize("name", ["transformer-softmax-every-site", "transformer-csparsemax-guided",
                                  "lstm-2x2-dependent"])
def test_beam_search_ranked_in_chunks_gives_the_ids_of_generate(name, monkeypatch):
    """The test models' vocabularies are too small for the chunked top-k (it starts at 4 k chunks): small chunks
    put it to work."""
    monkeypatch.setattr(decoding, "TOP_K_CHUNK", 2)
    model = MODELS[name]()
    add_eos_bias(model, eos_bias(name))
    input_ids, attention_mask = source_batch(LENGTHS)
    for options in (SEARCHES["beam-5-3-best"], SEARCHES["beam-4-min-new-tokens"]):
        with torch.inference_mode():
            expected = model.generate(input_ids=input_ids, attention_mask=attention_mask, max_new_tokens=12, **options)
        assert up_to_end(fast_generate(model, input_ids, attention_mask, max_new_tokens=12, **options)) == \
            up_to_end(expected)


@pytest.mark.parametrize("shape", [(3, 40_000), (2, 8_001), (4, 1_000)])
def test_top_k_through_chunk_maxima_is_torch_topk(shape):
    torch.manual_seed(0)
    scores = torch.log_softmax(torch.randn(shape), dim=-1)
    scores[0, :shape[1] // 2] = -1e9  # beams that count only from the first step on
    scores[:, 7] = -float("inf")  # an end of sentence suppressed below the minimum length
    values, indices = top_k(scores, 10)
    expected = torch.topk(scores, 10)
    assert torch.equal(values, expected.values) and torch.equal(indices, expected.indices)


def test_top_k_through_chunk_maxima_orders_ties_as_torch_topk():
    """Sums of log-probabilities tie often in float32 (at -225 they are 1.5e-5 apart): torch.topk orders equal values
    its own way, which the chunks' candidates alone would not reproduce (Malaviya's LSTM in
    examples/benchmark_fast_path.py: 1 of 128 sentences differed from generate at beam 5)."""
    torch.manual_seed(0)
    scores = (torch.log_softmax(torch.randn(64, 40_000), dim=-1) * 4).round() / 4  # many equal values
    scores[1, ::7] = -float("inf")
    scores[2, 100] = float("nan")  # torch.topk puts NaN first
    values, indices = top_k(scores, 10)
    expected = torch.topk(scores, 10)
    assert torch.allclose(values, expected.values, rtol=0, atol=0, equal_nan=True)
    assert torch.equal(indices, expected.indices) and values.is_contiguous() and indices.is_contiguous()


@pytest.mark.parametrize("name", ["transformer-softmax-every-site", "transformer-csparsemax-guided",
                                  "lstm-2x2-dependent"])
def test_hypotheses_longer_than_the_first_beam_buffers(name):
    """Beam search's token buffers start BEAM_BUFFER_COLUMNS wide and grow, up to max_length: hypotheses longer than
    the first buffers (the end of sentence made unlikely) are still generate's."""
    from hf_headattn.decoding import BEAM_BUFFER_COLUMNS

    model = MODELS[name]()
    add_eos_bias(model, eos_bias(name) - 4.0)
    input_ids, attention_mask = source_batch(LENGTHS)
    options = dict(max_new_tokens=BEAM_BUFFER_COLUMNS + 20, num_beams=3, no_repeat_ngram_size=2)
    with torch.inference_mode():
        expected = model.generate(input_ids=input_ids, attention_mask=attention_mask, **options)
    assert max(map(len, up_to_end(expected))) > BEAM_BUFFER_COLUMNS
    assert up_to_end(fast_generate(model, input_ids, attention_mask, **options)) == up_to_end(expected)


def test_the_test_models_end_sentences_at_many_lengths(model):
    """Otherwise nothing would leave the batch early, and dropping finished sentences would go untested."""
    assert len(output_lengths(model)) >= 5


@pytest.mark.parametrize("num_beams", [1, 5])
def test_padded_batch_gives_what_each_sentence_gives_alone(model, num_beams):
    input_ids, attention_mask = source_batch(LENGTHS)
    together = up_to_end(fast_generate(model, input_ids, attention_mask, num_beams=num_beams, max_new_tokens=12,
                                       **NO_REPEAT))
    for row, length in enumerate(LENGTHS):
        alone = fast_generate(model, input_ids[row:row + 1, :length], attention_mask[row:row + 1, :length],
                              num_beams=num_beams, max_new_tokens=12, **NO_REPEAT)
        assert up_to_end(alone) == [together[row]]


def test_beam_search_reorders_the_per_step_state(monkeypatch):
    """A stateful variant's state must follow its hypotheses: without reordering it, beam search would give other
    ids, so equality with generate (which reorders it) shows the fast path reorders it too."""
    from hf_headattn import HeadAttnCache

    model = random_model(tiny_config(**VARIANT_CONFIGS["running_sum"]))
    input_ids, attention_mask = source_batch(LENGTHS)
    options = dict(num_beams=5, max_new_tokens=12, **NO_REPEAT)
    reordered = up_to_end(fast_generate(model, input_ids, attention_mask, **options))
    monkeypatch.setattr(HeadAttnCache, "reorder_cache",  # the keys and values follow the beams, the states stay
                        lambda self, beam_idx: self.self_attention_cache.reorder_cache(beam_idx))
    assert up_to_end(fast_generate(model, input_ids, attention_mask, **options)) != reordered


def test_finished_rows_wait_until_their_steps_pay_for_a_drop():
    """Dropping copies every row that stays, about half a row's step each: finished rows are stepped along until
    the steps spent on them since the last drop reach half the rows that stay."""
    policy = decoding.RowDropPolicy()
    assert not policy.worth_dropping(0, 6)
    assert [policy.worth_dropping(1, 6) for _ in range(3)] == [False, False, True]  # 1, 2, 3 steps against 2.5
    policy.dropped()
    assert policy.worth_dropping(3, 6)  # 3 steps against 1.5: at once


@pytest.mark.parametrize("num_beams", [1, 5])
def test_finished_sentences_are_carried_along_until_a_drop_and_the_ids_stay_generates(num_beams, monkeypatch):
    """Some step carries finished rows instead of dropping them (their results were recorded the step they
    finished), some later step drops them, and the ids are generate's."""
    name = "transformer-softmax-every-site"
    model = MODELS[name]()
    add_eos_bias(model, eos_bias(name))
    input_ids, attention_mask = source_batch(LENGTHS)
    options = dict(num_beams=num_beams, max_new_tokens=20, **NO_REPEAT)
    decisions = []  # (finished rows, dropped now) at every step
    worth_dropping = decoding.RowDropPolicy.worth_dropping

    def spy(self, finished_rows, rows):
        decisions.append((finished_rows, worth_dropping(self, finished_rows, rows)))
        return decisions[-1][1]

    monkeypatch.setattr(decoding.RowDropPolicy, "worth_dropping", spy)
    fast = up_to_end(fast_generate(model, input_ids, attention_mask, **options))
    with torch.inference_mode():
        assert fast == up_to_end(model.generate(input_ids=input_ids, attention_mask=attention_mask, **options))
    assert any(finished and not dropped for finished, dropped in decisions)
    assert any(dropped for _, dropped in decisions)


@pytest.mark.parametrize("num_beams", [1, 5])
def test_the_self_attention_cache_changes_rows_only_with_its_appends(num_beams, monkeypatch):
    """Beam search reorders the cache at every step and finished sentences' rows are dropped: the fast path's
    self-attention cache (`RowsOnAppendLayer`) makes those changes with its next appends, never as a copy of their
    own (which would read every cached key once more: the copy it is there to save), and the ids stay generate's."""
    from hf_headattn.runtime.cache_headattn import RowsOnAppendLayer

    name = "transformer-softmax-every-site"
    model = MODELS[name]()
    add_eos_bias(model, eos_bias(name))
    input_ids, attention_mask = source_batch(LENGTHS)
    options = dict(num_beams=num_beams, max_new_tokens=20, **NO_REPEAT)
    appends_with_changes, settle, update = [], RowsOnAppendLayer._settle_rows, RowsOnAppendLayer.update

    def counted_update(self, *args, **kwargs):
        appends_with_changes.append(self.rows is not None)
        return update(self, *args, **kwargs)

    def settle_rows(self):
        assert self.rows is None, "a change of rows was copied before the next append"
        settle(self)

    monkeypatch.setattr(RowsOnAppendLayer, "update", counted_update)
    monkeypatch.setattr(RowsOnAppendLayer, "_settle_rows", settle_rows)
    fast = up_to_end(fast_generate(model, input_ids, attention_mask, **options))
    assert any(appends_with_changes)
    with torch.inference_mode():
        assert fast == up_to_end(model.generate(input_ids=input_ids, attention_mask=attention_mask, **options))

def test_options_the_fast_path_does_not_decode_go_to_generate():
    model = random_model(tiny_config())
    input_ids, attention_mask = source_batch(LENGTHS)
    with pytest.raises(FastPathUnsupported, match="sampling"):
        fast_generate(model, input_ids, attention_mask, do_sample=True, max_new_tokens=5)
    with pytest.raises(FastPathUnsupported, match="EncoderRepetitionPenaltyLogitsProcessor"):
        fast_generate(model, input_ids, attention_mask, encoder_repetition_penalty=1.5, max_new_tokens=5)
    for options in (dict(do_sample=True, top_k=5), dict(encoder_repetition_penalty=1.5, num_beams=3)):
        torch.manual_seed(0)
        with torch.inference_mode():
            expected = model.generate(input_ids=input_ids, attention_mask=attention_mask, max_new_tokens=5, **options)
        torch.manual_seed(0)
        got = generate_sequences(model, input_ids, attention_mask, max_new_tokens=5, **options)
        assert torch.equal(got, expected)


@pytest.mark.parametrize("num_beams", [1, 3])
def test_max_time_ends_every_sequence_as_generate_does(num_beams, monkeypatch):
    """With max_time over, every sequence ends at that step (generate's MaxTimeCriteria): fake clocks that run out
    after a few steps give both paths the same cut translations."""
    import time as time_module

    model = random_model(tiny_config())
    add_eos_bias(model, eos_bias("transformer-softmax-every-site"))
    input_ids, attention_mask = source_batch(LENGTHS)
    options = dict(num_beams=num_beams, max_new_tokens=20, max_time=1.0, **NO_REPEAT)

    def clock_ending_after(calls: int):
        ticks = iter(range(10**6))
        return lambda: 0.0 if next(ticks) < calls else 100.0

    results = []
    for decode in (lambda: model.generate(input_ids=input_ids, attention_mask=attention_mask, **options),
                   lambda: fast_generate(model, input_ids, attention_mask, **options)):
        monkeypatch.setattr(time_module, "time", clock_ending_after(4))
        with torch.inference_mode():
            results.append(up_to_end(decode()))
    assert results[0] == results[1]
    assert max(len(ids) for ids in results[0]) < 20  # cut by the clock, not by max_new_tokens
