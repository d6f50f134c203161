"""The share of exact zeros per attention site (hf_headattn.attention_sparsity), which RESULTS.md reports for every
quality run: counted over the (query, key) pairs a query may attend to only, checked against a count by hand."""

import pytest
import torch

from hf_headattn import train_tokenizer
from hf_headattn.attention_sparsity import attention_zero_shares
from hf_headattn.toy_corpus import make_toy_corpus

from helpers.models import random_model, tiny_config


@pytest.fixture(scope="module")
def toy_data():
    pairs = make_toy_corpus(120, seed=5)
    tokenizer = train_tokenizer(texts=[text for pair in pairs for text in pair], vocab_size=120, model="bpe")
    sources, targets = map(list, zip(*pairs[:7]))  # of different lengths: batches are padded
    return tokenizer, sources, targets


def _model(tokenizer, **sites):
    return random_model(tiny_config(vocab_size=len(tokenizer), pad_token_id=tokenizer.pad_token_id,
                                    eos_token_id=tokenizer.eos_token_id,
                                    decoder_start_token_id=tokenizer.pad_token_id, **sites))


def _count_alone(model, tokenizer, sources, targets, site):
    """The same count with one sentence a batch, so that nothing is padded: every weight of a row is counted, but
    in the decoder's self-attention only those on or below the diagonal."""
    zeros = counted = 0
    for source, target in zip(sources, targets):
        batch = tokenizer([source], text_target=[target], return_tensors="pt")
        with torch.no_grad():
            outputs = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                            labels=batch["labels"], output_attentions=True)
        for weights in {"encoder_self_attention": outputs.encoder_attentions,
                        "decoder_self_attention": outputs.decoder_attentions,
                        "cross_attention": outputs.cross_attentions}[site]:
            if site == "decoder_self_attention":
                allowed = torch.ones(weights.shape[-2:], dtype=torch.bool).tril().expand(weights.shape)
                zeros += int((weights[allowed] == 0).sum())
                counted += int(allowed.sum())
            else:
                zeros += int((weights == 0).sum())
                counted += weights.numel()
    return zeros, counted


def test_sparsemax_zeros_are_counted_over_the_pairs_a_query_may_attend_to(toy_data):
    tokenizer, sources, targets = toy_data
    model = _model(tokenizer, encoder_self_attention="sparsemax", decoder_self_attention="sparsemax",
                   cross_attention="sparsemax")
    shares = attention_zero_shares(model, tokenizer, sources, targets, batch_size=4, progress=False)
    assert set(shares) == {"encoder_self_attention", "decoder_self_attention", "cross_attention"}
    for site, share in shares.items():
        zeros, counted = _count_alone(model, tokenizer, sources, targets, site)
        assert share["weights"] == counted
        assert share["zero_share"] == pytest.approx(zeros / counted)
        assert 0 < share["zero_share"] < 1  # random weights: sparsemax leaves some keys and zeroes others
        assert len(share["zero_share_by_layer"]) == 2


def test_softmax_has_no_zeros_where_sparsemax_has_them(toy_data):
    tokenizer, sources, targets = toy_data
    shares = attention_zero_shares(_model(tokenizer, cross_attention="sparsemax"), tokenizer, sources, targets,
                                   progress=False)
    assert shares["encoder_self_attention"]["zero_share"] == 0  # masked padding is not counted
    assert shares["decoder_self_attention"]["zero_share"] == 0  # nor the causal mask's future positions
    assert shares["cross_attention"]["zero_share"] > 0


def test_mismatched_texts_are_refused(toy_data):
    tokenizer, sources, targets = toy_data
    with pytest.raises(ValueError, match="7 sources but 6 targets"):
        attention_zero_shares(_model(tokenizer), tokenizer, sources, targets[:6])
