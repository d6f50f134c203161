"""benchmarks/quality/constrained_attention_stats.py, the diagnostic behind RESULTS.md's notes on the LSTM's sparse
attention: its statistics on models whose attention is known by construction."""

import pytest
import torch

from hf_headattn import HeadAttnRNNConfig, HeadAttnRNNForConditionalGeneration, train_tokenizer
from hf_headattn.toy_corpus import make_toy_corpus

from helpers import REPO, load_script


def load_diagnostic():
    return load_script(REPO / "benchmarks" / "quality" / "constrained_attention_stats.py")


@pytest.fixture(scope="module")
def corpus():
    pairs = make_toy_corpus(40, seed=5)
    tokenizer = train_tokenizer(texts=[text for pair in pairs for text in pair], vocab_size=150, model="bpe")
    return tokenizer, [s for s, _ in pairs[:12]], [t for _, t in pairs[:12]]


def lstm(tokenizer, **overrides) -> HeadAttnRNNForConditionalGeneration:
    torch.manual_seed(0)
    config = HeadAttnRNNConfig(vocab_size=len(tokenizer), embedding_size=16, hidden_size=24, dropout=0.0,
                               pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id,
                               decoder_start_token_id=tokenizer.pad_token_id, **overrides)
    return HeadAttnRNNForConditionalGeneration(config)


def test_sparsemax_over_equal_scores_attends_every_source_token_equally(corpus):
    tokenizer, sources, targets = corpus
    model = lstm(tokenizer, attention_transform="sparsemax")
    with torch.no_grad():
        model.model.decoder.attention.query_proj.weight.zero_()  # every score 0: sparsemax is uniform
    stats = load_diagnostic().statistics(model, tokenizer, sources, targets, batch_size=5)  # padded batches

    source_lengths = [len(ids) for ids in tokenizer(sources)["input_ids"]]
    target_lengths = [len(ids) for ids in tokenizer(text_target=targets)["input_ids"]]
    steps = sum(target_lengths)
    assert stats["source_tokens_attended_per_step"] == pytest.approx(
        sum(s * t for s, t in zip(source_lengths, target_lengths)) / steps)
    assert stats["weight_of_the_most_attended_token"] == pytest.approx(
        sum(t / s for s, t in zip(source_lengths, target_lengths)) / steps)
    assert min(source_lengths) > 1 and stats["steps_attending_one_source_token"] == 0
    assert stats["sink_share"] == pytest.approx(0, abs=1e-6)
    assert stats["sentences"] == len(sources)
    assert stats["fertility_sum_over_target_length"] is None and stats["source_tokens_exhausted_at_end"] is None


class FirstTokenAttention(torch.nn.Module):
    """A model whose reported cross-attention puts all weight on the first source token."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def get_encoder(self):
        return self.model.get_encoder()

    def forward(self, **inputs):
        outputs = self.model(**inputs)
        outputs.cross_attentions = tuple(torch.zeros_like(w).index_fill_(-1, torch.tensor([0]), 1.0)
                                         for w in outputs.cross_attentions)
        return outputs


def test_attention_on_one_source_token_counts_as_a_one_token_step(corpus):
    tokenizer, sources, targets = corpus
    model = FirstTokenAttention(lstm(tokenizer, attention_transform="sparsemax"))
    stats = load_diagnostic().statistics(model, tokenizer, sources, targets, batch_size=5)
    assert stats["source_tokens_attended_per_step"] == pytest.approx(1)
    assert stats["steps_attending_one_source_token"] == pytest.approx(1)
    assert stats["weight_of_the_most_attended_token"] == pytest.approx(1)


def test_constrained_model_reports_its_fertility_and_bounds(corpus):
    tokenizer, sources, targets = corpus
    model = lstm(tokenizer, attention_transform="csparsemax", fertility="constant", constant_fertility=2)
    stats = load_diagnostic().statistics(model, tokenizer, sources, targets, batch_size=5)
    source_lengths = [len(ids) for ids in tokenizer(sources)["input_ids"]]
    target_lengths = [len(ids) for ids in tokenizer(text_target=targets)["input_ids"]]
    # CONSTANT fertility 2 for every real source token
    expected_ratio = sum(2 * s / t for s, t in zip(source_lengths, target_lengths)) / len(sources)
    assert stats["fertility_sum_over_target_length"]["mean"] == pytest.approx(expected_ratio)
    for key in ("sink_share", "steps_whose_most_attended_token_is_at_its_bound", "source_tokens_exhausted_at_end",
                "steps_attending_one_source_token"):
        assert 0 <= stats[key] <= 1, key
