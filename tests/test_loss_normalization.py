"""`loss_normalization`: what an optimizer step's summed token loss is divided by before the backward pass, its
target tokens (Transformers' default) or its sentences (OpenNMT-py 2017's `loss.div(batch.batch_size)`, the
normalisation of `--preset malaviya2018`), checked against one SGD step computed by hand."""

import copy

import pytest
import torch
from datasets import Dataset
from transformers import DataCollatorForSeq2Seq, Seq2SeqTrainingArguments

from helpers import rnn_config, tiny_config
from hf_headattn import HeadAttnForConditionalGeneration, HeadAttnRNNForConditionalGeneration
from hf_headattn.tokenization import train_tokenizer
from hf_headattn.toy_corpus import make_toy_corpus
from hf_headattn.training.trainer import HeadAttnSeq2SeqTrainer

PAIRS = make_toy_corpus(8, seed=3)


@pytest.fixture(scope="module")
def tokenizer():
    texts = [text for pair in make_toy_corpus(200, seed=1) for text in pair]
    return train_tokenizer(texts=texts, vocab_size=120, model="bpe")


def _model(family: str, tokenizer):
    torch.manual_seed(0)
    if family == "lstm":
        return HeadAttnRNNForConditionalGeneration(rnn_config(vocab_size=len(tokenizer)))
    return HeadAttnForConditionalGeneration(tiny_config(vocab_size=len(tokenizer)))


def _batch(tokenizer, model):
    sources, targets = zip(*PAIRS)
    features = tokenizer(list(sources), text_target=list(targets))
    collator = DataCollatorForSeq2Seq(tokenizer, model=model, label_pad_token_id=-100)
    rows = [{key: features[key][i] for key in features} for i in range(len(PAIRS))]
    return Dataset.from_list(rows), collator(rows)


def _one_sgd_step(model, tokenizer, data, tmp_path, normalization: str, batch_size: int, accumulation: int):
    arguments = Seq2SeqTrainingArguments(
        output_dir=str(tmp_path), report_to="none", use_cpu=True, save_strategy="no", disable_tqdm=True,
        logging_steps=1, max_steps=1, optim="sgd", learning_rate=1.0, weight_decay=0.0, max_grad_norm=0.0,
        lr_scheduler_type="constant", per_device_train_batch_size=batch_size, gradient_accumulation_steps=accumulation,
        seed=0)
    trainer = HeadAttnSeq2SeqTrainer(
        model=model, args=arguments, train_dataset=data, loss_normalization=normalization,
        data_collator=DataCollatorForSeq2Seq(tokenizer, model=model, label_pad_token_id=-100))
    trainer.train()
    return trainer


@pytest.mark.parametrize("family", ["transformer", "lstm"])
@pytest.mark.parametrize("normalization", ["tokens", "sentences"])
@pytest.mark.parametrize("batch_size, accumulation", [(8, 1), (4, 2)])
def test_one_sgd_step_follows_the_summed_loss_over_tokens_or_sentences(family, normalization, batch_size,
                                                                      accumulation, tokenizer, tmp_path):
    model = _model(family, tokenizer)
    data, batch = _batch(tokenizer, model)
    tokens, sentences = int(batch["labels"].ne(-100).sum()), len(PAIRS)
    assert tokens > 2 * sentences  # the two normalisations differ by the mean target length

    by_hand = copy.deepcopy(model).train()
    logits = by_hand(**{key: value for key, value in batch.items() if key != "labels"}).logits
    summed = torch.nn.functional.cross_entropy(logits.flatten(0, 1), batch["labels"].flatten(), ignore_index=-100,
                                               reduction="sum")
    (summed / (sentences if normalization == "sentences" else tokens)).backward()
    expected = {name: parameter - parameter.grad for name, parameter in by_hand.named_parameters()}

    trainer = _one_sgd_step(model, tokenizer, data, tmp_path, normalization, batch_size, accumulation)
    for name, parameter in model.named_parameters():
        torch.testing.assert_close(parameter, expected[name], rtol=1e-4, atol=1e-5, msg=name)
    logged = next(entry["loss"] for entry in trainer.state.log_history if "loss" in entry)
    assert logged == pytest.approx(summed.item() / tokens, rel=1e-4)  # per token either way


def test_an_unknown_normalization_is_refused(tokenizer, tmp_path):
    model = _model("lstm", tokenizer)
    data, _ = _batch(tokenizer, model)
    with pytest.raises(ValueError, match="loss_normalization='words': give one of tokens, sentences"):
        _one_sgd_step(model, tokenizer, data, tmp_path, "words", 8, 1)
