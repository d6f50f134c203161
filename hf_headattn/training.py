"""Training helpers around `Seq2SeqTrainer`: parallel data loading, tokenisation, BLEU/chrF metrics, and the
training command behind `examples/train_translation.py` and the demo.

Tooling, not model runtime: never copied into a checkpoint.
"""

import argparse
import json
import math
from pathlib import Path

import numpy as np
import sacrebleu
from datasets import Dataset, DatasetDict, load_dataset
import torch
from transformers import AutoTokenizer, DataCollatorForSeq2Seq, Seq2SeqTrainer, Seq2SeqTrainingArguments, set_seed

from .runtime.configuration_headattn import HeadAttnConfig
from .runtime.configuration_headattn_rnn import ATTENTION_SCORES, ATTENTION_TRANSFORMS, HeadAttnRNNConfig
from .runtime.modeling_headattn import HeadAttnForConditionalGeneration
from .runtime.modeling_headattn_rnn import HeadAttnRNNForConditionalGeneration
from .tokenization import train_tokenizer


USAGE = """Train a HeadAttn translation model with Seq2SeqTrainer, evaluate BLEU/chrF, and save a folder that loads
anywhere through `trust_remote_code` (model, tokenizer, code, pipeline).

Parallel text files:
    python examples/train_translation.py --train-source ../shared/data/multi30k/train.de \
        --train-target ../shared/data/multi30k/train.en --valid-source ../shared/data/multi30k/val.de \
        --valid-target ../shared/data/multi30k/val.en --output-dir runs/de-en
A Hugging Face dataset (Hub name or local folder) with a `translation` column:
    python examples/train_translation.py --dataset wmt16 --dataset-config de-en --source-lang de \
        --target-lang en --output-dir runs/wmt16
Two processes on CPU (accelerate launch --cpu --num_processes 2 silently runs one; torchrun really runs two):
    torchrun --nproc_per_node 2 examples/train_translation.py ... --output-dir runs/ddp
Attention variants per site, as JSON: --cross-attention '{"type": "running_sum", "layers": [-1]}'
The LSTM encoder-decoder (Iida et al.; Malaviya et al.), e.g. 2 heads x 2 dependent hops with csparsemax:
    python examples/train_translation.py ... --architecture rnn --heads 2 --hops 2 \
        --attention-transform csparsemax --fertility predicted
"""


def read_parallel_files(source_path: str | Path, target_path: str | Path, max_pairs: int | None = None) -> Dataset:
    """Line-aligned source/target text files -> Dataset with `source` and `target` columns."""
    source_path, target_path = Path(source_path), Path(target_path)
    for path in (source_path, target_path):
        if not path.is_file():
            raise FileNotFoundError(f"Parallel text file not found: {path}")
    sources = source_path.read_text(encoding="utf-8").splitlines()
    targets = target_path.read_text(encoding="utf-8").splitlines()
    if len(sources) != len(targets):
        raise ValueError(
            f"{source_path} has {len(sources)} lines but {target_path} has {len(targets)}; parallel files must be "
            "line-aligned"
        )
    if max_pairs is not None:
        sources, targets = sources[:max_pairs], targets[:max_pairs]
    return Dataset.from_dict({"source": sources, "target": targets})


MULTI30K_FILES = ("train.de", "train.en", "val.de", "val.en", "test_2016_flickr.de", "test_2016_flickr.en")


def multi30k_paths(data_dir: str | Path) -> dict[str, Path]:
    """The Multi30k De-En files (see ../shared/data/multi30k/README) by name, checked to exist."""
    data_dir = Path(data_dir)
    missing = [name for name in MULTI30K_FILES if not (data_dir / name).is_file()]
    if missing:
        raise FileNotFoundError(f"{data_dir} lacks {', '.join(missing)}; point --data-dir at the Multi30k folder "
                                f"(it holds {', '.join(MULTI30K_FILES)})")
    return {name: data_dir / name for name in MULTI30K_FILES}


def load_hub_translation_dataset(
    name: str,
    config_name: str | None,
    source_lang: str,
    target_lang: str,
    split: str,
    max_pairs: int | None = None,
) -> Dataset:
    """A Hugging Face dataset (Hub name or local folder) whose rows hold a `translation` dict keyed by language,
    or one column per language, -> Dataset with `source` and `target` columns."""
    dataset = load_dataset(name, config_name, split=split)
    if max_pairs is not None:
        dataset = dataset.select(range(min(max_pairs, len(dataset))))
    if "translation" in dataset.column_names:
        languages = set(dataset[0]["translation"])
        if not {source_lang, target_lang} <= languages:
            raise ValueError(
                f"Dataset {name!r} has languages {sorted(languages)}; asked for {source_lang!r} -> {target_lang!r}"
            )
        return dataset.map(
            lambda row: {"source": row["translation"][source_lang], "target": row["translation"][target_lang]},
            remove_columns=dataset.column_names,
        )
    missing = [lang for lang in (source_lang, target_lang) if lang not in dataset.column_names]
    if missing:
        raise ValueError(
            f"Dataset {name!r} has neither a 'translation' column nor columns {missing}; columns: {dataset.column_names}"
        )
    return dataset.map(
        lambda row: {"source": row[source_lang], "target": row[target_lang]}, remove_columns=dataset.column_names
    )


def score_translations(hypotheses: list[str], references: list[str]) -> dict:
    """Corpus BLEU and chrF with sacrebleu's default settings."""
    return {
        "bleu": sacrebleu.corpus_bleu(hypotheses, [references]).score,
        "chrf": sacrebleu.corpus_chrf(hypotheses, [references]).score,
    }


def translate_and_score(model_dir: str | Path, source_path: str | Path, reference_path: str | Path,
                        num_beams: int = 4, batch_size: int = 32) -> dict:
    """Translate a test file with a saved model folder (loaded through its own code) and score it with sacrebleu."""
    from transformers import AutoModelForSeq2SeqLM

    test = read_parallel_files(source_path, reference_path)
    tokenizer = AutoTokenizer.from_pretrained(model_dir, trust_remote_code=True)
    model = AutoModelForSeq2SeqLM.from_pretrained(model_dir, trust_remote_code=True).eval()
    hypotheses = translate_sentences(model, tokenizer, test["source"], num_beams, batch_size,
                                     desc=f"translating {Path(source_path).name}")
    return {**score_translations(hypotheses, test["target"]), "sentences": len(hypotheses), "hypotheses": hypotheses}


def translate_sentences(model, tokenizer, sources: list[str], num_beams: int = 4, batch_size: int = 32,
                        desc: str = "translating") -> list[str]:
    """Batched beam-search translation with a progress bar."""
    from tqdm.auto import tqdm

    hypotheses = []
    for start in tqdm(range(0, len(sources), batch_size), desc=desc):
        batch = tokenizer(sources[start : start + batch_size], return_tensors="pt", padding=True, truncation=True)
        with torch.no_grad():
            output_ids = model.generate(**batch.to(model.device), num_beams=num_beams)
        hypotheses += [text.strip() for text in tokenizer.batch_decode(output_ids, skip_special_tokens=True)]
    return hypotheses


def tokenize_parallel(dataset: DatasetDict | Dataset, tokenizer, max_length: int = 128):
    """Add `input_ids`, `attention_mask` and `labels`; sentences longer than `max_length` are truncated."""

    def encode(batch):
        return tokenizer(batch["source"], text_target=batch["target"], max_length=max_length, truncation=True)

    return dataset.map(encode, batched=True, remove_columns=["source", "target"])


def translation_metrics(tokenizer):
    """`compute_metrics` for `Seq2SeqTrainer(predict_with_generate=True)`: corpus BLEU and chrF (sacrebleu)."""
    def compute(eval_prediction):
        predictions, labels = eval_prediction.predictions, eval_prediction.label_ids
        if isinstance(predictions, tuple):
            predictions = predictions[0]
        predictions = np.where(predictions < 0, tokenizer.pad_token_id, predictions)
        labels = np.where(labels < 0, tokenizer.pad_token_id, labels)
        hypotheses = [text.strip() for text in tokenizer.batch_decode(predictions, skip_special_tokens=True)]
        references = [text.strip() for text in tokenizer.batch_decode(labels, skip_special_tokens=True)]
        return score_translations(hypotheses, references)

    return compute


class HeadAttnSeq2SeqTrainer(Seq2SeqTrainer):
    """`Seq2SeqTrainer` that also logs the parts of the loss the attention variants add: `aux_loss` and
    `head_kl` (DHICM's KL(importances || uniform)), averaged over the micro-batches since the last log.

    The model computes its own label-smoothed loss (`config.label_smoothing`) so that the auxiliary loss is part
    of it; Trainer's `label_smoothing_factor` would recompute the loss from the logits alone and drop that term,
    so it is refused here."""

    LOGGED_PARTS = ("aux_loss", "head_kl")

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        if self.args.label_smoothing_factor:
            raise ValueError(
                f"label_smoothing_factor={self.args.label_smoothing_factor} makes Trainer recompute the loss from the "
                "logits and drop the attention variants' auxiliary loss; set the model's `config.label_smoothing` "
                "instead and leave label_smoothing_factor at 0"
            )
        self._loss_parts: dict[str, list] = {}

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        loss, outputs = super().compute_loss(model, inputs, return_outputs=True, num_items_in_batch=num_items_in_batch)
        if model.training and isinstance(outputs, dict):
            for name in self.LOGGED_PARTS:
                if outputs.get(name) is not None:
                    self._loss_parts.setdefault(name, []).append(outputs[name].detach())
        return (loss, outputs) if return_outputs else loss

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        if "loss" in logs and self._loss_parts:  # a training log, not an evaluation one
            for name, values in self._loss_parts.items():
                logs[name] = torch.stack(values).float().mean().item()
            self._loss_parts = {}
        super().log(logs, start_time)


def prepare_fertility(model, tokenizer, sources: list[str], targets: list[str], predictor_epochs: int = 5,
                      seed: int = 0) -> None:
    """Fill in what the GUIDED and PREDICTED fertility strategies (Malaviya et al., 2018, Sec. 4) learn from the
    training data: eflomal alignments of its subword tokens give each source token's fertility; GUIDED keeps
    the largest per token id in the encoder's `source_fertility.guided_fertility` table, PREDICTED trains the
    encoder's bi-LSTM `source_fertility.fertility_predictor` on them (+1 slack). Works for both model families;
    nothing to do for CONSTANT or models without constrained attention."""
    from .alignment import corpus_token_fertilities, guided_fertility_table, train_fertility_predictor

    config, bounds = model.config, model.get_encoder().source_fertility
    if bounds is None or config.fertility == "constant":
        return
    source_ids, fertilities = corpus_token_fertilities(tokenizer, list(sources), list(targets), seed=seed)
    if config.fertility == "guided":
        with torch.no_grad():
            bounds.guided_fertility.copy_(guided_fertility_table(source_ids, fertilities, config.vocab_size))
    else:
        train_fertility_predictor(bounds.fertility_predictor, source_ids, fertilities, epochs=predictor_epochs,
                                  seed=seed)


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=USAGE, formatter_class=argparse.RawDescriptionHelpFormatter)
    data = parser.add_argument_group("data")
    data.add_argument("--train-source", help="source side of the training text, one sentence a line")
    data.add_argument("--train-target", help="target side of the training text, line-aligned with --train-source")
    data.add_argument("--valid-source")
    data.add_argument("--valid-target")
    data.add_argument("--dataset", help="Hugging Face dataset name or local dataset folder (instead of text files)")
    data.add_argument("--dataset-config", default=None)
    data.add_argument("--source-lang", default="de")
    data.add_argument("--target-lang", default="en")
    data.add_argument("--train-split", default="train")
    data.add_argument("--valid-split", default="validation")
    data.add_argument("--max-train-pairs", type=int, default=None, help="use only the first N training pairs")
    data.add_argument("--max-valid-pairs", type=int, default=None)
    data.add_argument("--max-length", type=int, default=128, help="longer sentences are truncated to this many tokens")

    model = parser.add_argument_group("model")
    model.add_argument("--architecture", default="transformer", choices=["transformer", "rnn"],
                       help="Marian-style Transformer (HeadAttnConfig) or attentional LSTM (HeadAttnRNNConfig)")
    model.add_argument("--tokenizer", help="existing tokenizer folder; default: train one on the training text")
    model.add_argument("--vocab-size", type=int, default=8000)
    model.add_argument("--tokenizer-model", default="bpe", choices=["bpe", "unigram"])
    model.add_argument("--layers", type=int, default=None,
                       help="encoder and decoder layers (default: 3 for the Transformer, 1 for the LSTM)")
    model.add_argument("--heads", type=int, default=None,
                       help="attention heads (default: 4 for the Transformer, 1 for the LSTM)")
    model.add_argument("--dropout", type=float, default=0.1)
    model.add_argument("--label-smoothing", type=float, default=0.1, help="computed in the model's own loss")
    model.add_argument("--fertility", default="constant", choices=["constant", "guided", "predicted"],
                       help="fertility bounds of csoftmax/csparsemax attention (guided/predicted align the "
                            "training data with eflomal first)")
    model.add_argument("--constant-fertility", type=float, default=2.0)
    model.add_argument("--fertility-predictor-epochs", type=int, default=5)
    transformer = parser.add_argument_group("Transformer (--architecture transformer)")
    transformer.add_argument("--d-model", type=int, default=256)
    transformer.add_argument("--ffn-dim", type=int, default=1024)
    transformer.add_argument("--position-embedding", default="sinusoidal", choices=["sinusoidal", "none"])
    for site in ("encoder-self-attention", "decoder-self-attention", "cross-attention"):
        transformer.add_argument(f"--{site}", default="softmax", help="variant name or JSON spec for this site")
    rnn = parser.add_argument_group("LSTM (--architecture rnn)")
    rnn.add_argument("--embedding-size", type=int, default=256)
    rnn.add_argument("--hidden-size", type=int, default=512, help="decoder state and context size d")
    rnn.add_argument("--hops", type=int, default=1, help="K, counting the first hop (Iida et al.)")
    rnn.add_argument("--hop-mode", default="dependent", choices=["dependent", "independent"])
    rnn.add_argument("--attention-score", default="general", choices=list(ATTENTION_SCORES))
    rnn.add_argument("--attention-transform", default="softmax", choices=list(ATTENTION_TRANSFORMS))
    rnn.add_argument("--coverage-vector", action="store_true", help="Tu et al.'s coverage vector (Malaviya et al.)")

    train = parser.add_argument_group("training")
    train.add_argument("--output-dir", required=True)
    train.add_argument("--epochs", type=float, default=10)
    train.add_argument("--max-steps", type=int, default=-1)
    train.add_argument("--batch-size", type=int, default=64)
    train.add_argument("--gradient-accumulation-steps", type=int, default=1)
    train.add_argument("--learning-rate", type=float, default=5e-4)
    train.add_argument("--warmup-steps", type=int, default=200)
    train.add_argument("--num-beams", type=int, default=4, help="beam size for evaluation")
    train.add_argument("--seed", type=int, default=42)
    train.add_argument("--logging-steps", type=int, default=50)
    args = parser.parse_args(argv)

    uses_files = args.train_source is not None or args.train_target is not None
    if uses_files == (args.dataset is not None):
        parser.error("give either --train-source/--train-target (text files) or --dataset, not both or neither")
    if uses_files and (args.train_source is None or args.train_target is None):
        parser.error("--train-source and --train-target go together")
    if (args.valid_source is None) != (args.valid_target is None):
        parser.error("--valid-source and --valid-target go together")
    return args


def attention_spec(value: str):
    """A plain variant name, or a JSON dict / list of dicts."""
    return json.loads(value) if value.lstrip().startswith(("{", "[")) else value


def load_data(args):
    if args.dataset is not None:
        train = load_hub_translation_dataset(args.dataset, args.dataset_config, args.source_lang, args.target_lang,
                                             args.train_split, args.max_train_pairs)
        valid = load_hub_translation_dataset(args.dataset, args.dataset_config, args.source_lang, args.target_lang,
                                             args.valid_split, args.max_valid_pairs)
        return train, valid
    train = read_parallel_files(args.train_source, args.train_target, args.max_train_pairs)
    if args.valid_source is None:
        # hold out the last 5% (at least one pair) of the training text
        split = train.train_test_split(test_size=max(1, len(train) // 20), shuffle=False)
        return split["train"], split["test"]
    return train, read_parallel_files(args.valid_source, args.valid_target, args.max_valid_pairs)


def main(argv=None):
    args = parse_args(argv)
    set_seed(args.seed)
    output_dir = Path(args.output_dir)
    training_args = Seq2SeqTrainingArguments(
        output_dir=str(output_dir / "checkpoints"),
        num_train_epochs=args.epochs,
        max_steps=args.max_steps,
        per_device_train_batch_size=args.batch_size,
        per_device_eval_batch_size=args.batch_size,
        gradient_accumulation_steps=args.gradient_accumulation_steps,
        learning_rate=args.learning_rate,
        warmup_steps=args.warmup_steps,
        lr_scheduler_type="inverse_sqrt",
        weight_decay=0.0,
        eval_strategy="epoch" if args.max_steps < 0 else "no",
        save_strategy="no",
        logging_steps=args.logging_steps,
        predict_with_generate=True,
        generation_num_beams=args.num_beams,
        generation_max_length=args.max_length,
        report_to="none",
        seed=args.seed,
        use_cpu=True if not _cuda_available() else False,
    )

    train_text, valid_text = load_data(args)
    with training_args.main_process_first(desc="tokenizer"):
        if args.tokenizer is not None:
            tokenizer = AutoTokenizer.from_pretrained(args.tokenizer)
        elif training_args.process_index == 0:
            tokenizer = train_tokenizer(
                texts=list(train_text["source"]) + list(train_text["target"]),
                vocab_size=args.vocab_size,
                model=args.tokenizer_model,
                save_directory=output_dir / "tokenizer",
                model_max_length=args.max_length,
            )
        else:
            tokenizer = AutoTokenizer.from_pretrained(output_dir / "tokenizer")
    with training_args.main_process_first(desc="tokenization"):
        train_dataset = tokenize_parallel(train_text, tokenizer, args.max_length)
        valid_dataset = tokenize_parallel(valid_text, tokenizer, args.max_length)

    model = build_model(args, tokenizer)
    prepare_fertility(model, tokenizer, train_text["source"], train_text["target"],
                      predictor_epochs=args.fertility_predictor_epochs, seed=args.seed)
    model.generation_config.max_length = args.max_length
    model.generation_config.num_beams = args.num_beams

    trainer = HeadAttnSeq2SeqTrainer(
        model=model,
        args=training_args,
        train_dataset=train_dataset,
        eval_dataset=valid_dataset,
        data_collator=DataCollatorForSeq2Seq(tokenizer, model=model, label_pad_token_id=-100),
        processing_class=tokenizer,
        compute_metrics=translation_metrics(tokenizer),
    )
    metrics = dict(trainer.train().metrics)
    metrics.update(trainer.evaluate(metric_key_prefix="valid"))
    metrics["world_size"] = training_args.world_size
    metrics["train_pairs"] = len(train_dataset)
    metrics["parameters"] = sum(parameter.numel() for parameter in model.parameters())

    if trainer.is_world_process_zero():
        trainer.save_model(str(output_dir))  # model, config, code files and tokenizer
        (output_dir / "train_results.json").write_text(json.dumps(_jsonable(metrics), indent=2) + "\n")
        print(json.dumps(_jsonable(metrics), indent=2))
    return metrics


def build_model(args, tokenizer):
    """A freshly initialised model of the architecture and sizes the command line names."""
    shared = dict(
        vocab_size=len(tokenizer),
        dropout=args.dropout,
        label_smoothing=args.label_smoothing,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        decoder_start_token_id=tokenizer.pad_token_id,
        fertility=args.fertility,
        constant_fertility=args.constant_fertility,
    )
    if args.architecture == "rnn":
        layers = args.layers if args.layers is not None else 1
        config = HeadAttnRNNConfig(
            embedding_size=args.embedding_size,
            hidden_size=args.hidden_size,
            encoder_layers=layers,
            decoder_layers=layers,
            num_heads=args.heads if args.heads is not None else 1,
            num_hops=args.hops,
            hop_mode=args.hop_mode,
            attention_score=args.attention_score,
            attention_transform=args.attention_transform,
            coverage_vector=args.coverage_vector,
            **shared,
        )
        return HeadAttnRNNForConditionalGeneration(config)
    layers = args.layers if args.layers is not None else 3
    heads = args.heads if args.heads is not None else 4
    config = HeadAttnConfig(
        d_model=args.d_model,
        encoder_layers=layers,
        decoder_layers=layers,
        encoder_attention_heads=heads,
        decoder_attention_heads=heads,
        encoder_ffn_dim=args.ffn_dim,
        decoder_ffn_dim=args.ffn_dim,
        position_embedding=args.position_embedding,
        max_position_embeddings=max(512, args.max_length + 2),
        encoder_self_attention=attention_spec(args.encoder_self_attention),
        decoder_self_attention=attention_spec(args.decoder_self_attention),
        cross_attention=attention_spec(args.cross_attention),
        **shared,
    )
    return HeadAttnForConditionalGeneration(config)


def _cuda_available() -> bool:
    return torch.cuda.is_available()


def _jsonable(metrics: dict) -> dict:
    return {key: (None if isinstance(value, float) and math.isnan(value) else value) for key, value in metrics.items()}
