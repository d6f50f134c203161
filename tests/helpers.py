"""Small models and inputs shared by the tests."""

import importlib.util
from pathlib import Path

import torch

from hf_headattn import HeadAttnConfig, HeadAttnForConditionalGeneration
from hf_headattn.toy_corpus import write_toy_corpus
from hf_headattn.training import train


# Prepended to scripts run in a fresh interpreter: makes hf_headattn unimportable there, so that a saved folder
# must load through its own copied code (trust_remote_code), as for a user who never installed the package.
WITHOUT_PACKAGE = """import importlib.abc, json, sys

class BlockPackage(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "hf_headattn" or name.startswith("hf_headattn."):
            raise ImportError("hf_headattn is deliberately not importable in this process")

sys.meta_path.insert(0, BlockPackage())
"""

REPO = Path(__file__).resolve().parents[1]
MULTI30K = REPO.parent / "shared" / "data" / "multi30k"  # real data beside the checkout, as on CI

VOCAB = 64
PAD, EOS = 0, 1


def tiny_config(**overrides) -> HeadAttnConfig:
    settings = dict(
        vocab_size=VOCAB,
        d_model=32,
        encoder_layers=2,
        decoder_layers=2,
        encoder_attention_heads=4,
        decoder_attention_heads=4,
        encoder_ffn_dim=64,
        decoder_ffn_dim=64,
        max_position_embeddings=64,
        dropout=0.0,
        pad_token_id=PAD,
        eos_token_id=EOS,
        decoder_start_token_id=PAD,
    )
    settings.update(overrides)
    return HeadAttnConfig(**settings)


def random_model(config: HeadAttnConfig, seed: int = 0, std: float = 0.3) -> HeadAttnForConditionalGeneration:
    """A model with weights large enough that greedy and beam search produce varied, length-varying outputs."""
    torch.manual_seed(seed)
    model = HeadAttnForConditionalGeneration(config)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "layer_norm" not in name:
                parameter.normal_(0.0, std)
        model.final_logits_bias.normal_(0.0, 1.0)
    return model.eval()


def source_batch(lengths=(7, 4, 9), seed: int = 1):
    """Right-padded source ids ending in EOS, and their attention mask."""
    generator = torch.Generator().manual_seed(seed)
    width = max(lengths)
    input_ids = torch.full((len(lengths), width), PAD)
    attention_mask = torch.zeros((len(lengths), width), dtype=torch.long)
    for row, length in enumerate(lengths):
        input_ids[row, : length - 1] = torch.randint(2, VOCAB, (length - 1,), generator=generator)
        input_ids[row, length - 1] = EOS
        attention_mask[row, :length] = 1
    return input_ids, attention_mask


# Tiny trained folders of both families, made with the training command
N_TRAIN, N_TEST = 200, 12
FAMILIES = {  # the training command's flags for a tiny model of each family
    "transformer": ["--architecture", "transformer", "--d_model", "32", "--layers", "2", "--heads", "4",
                    "--ffn_dim", "64"],
    "rnn": ["--architecture", "rnn", "--embedding_size", "16", "--hidden_size", "32", "--heads", "2", "--hops", "2"],
}


def toy_data(directory: Path) -> dict[str, Path]:
    """A toy German-English corpus: train.src/.tgt (200 pairs), valid.* (8) and test.* (12)."""
    return write_toy_corpus(directory, n_train=N_TRAIN, n_valid=8, n_test=N_TEST, seed=0)


def train_tiny_model(data: dict[str, Path], output_dir: Path, family: str, *extra: str, max_length: int = 12) -> Path:
    """A tiny model trained for 3 optimizer steps with the training command: a real saved folder (model,
    tokenizer, code, pipeline, train_results.json, training_args.bin), in about a second. Outputs are at
    most `max_length` tokens long (the barely trained model rarely stops earlier), which keeps decoding cheap; the
    default 12 truncates some toy sentences (with a warning), 48 keeps them whole."""
    train([
        *FAMILIES[family], *extra,
        "--train_source", str(data["train.src"]), "--train_target", str(data["train.tgt"]),
        "--valid_source", str(data["valid.src"]), "--valid_target", str(data["valid.tgt"]),
        "--output_dir", str(output_dir), "--max_steps", "3", "--vocab_size", "200", "--max_length", str(max_length),
        "--per_device_train_batch_size", "16", "--warmup_steps", "1", "--logging_steps", "1",
    ])
    return output_dir


def load_script(path: Path):
    """A script of the repository (examples/, benchmarks/: not packages) as a module, to call its functions."""
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def load_example(name: str):
    """The script examples/<name>.py as a module."""
    return load_script(REPO / "examples" / f"{name}.py")
