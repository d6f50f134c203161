"""Figures for analysing trained models, written to PNG with matplotlib.

    python -m hf_headattn.plotting head-importances --model runs/dhicm --sentence "ein hund läuft ." \
        --output head_importances.png [--module encoder.layers.5.self_attn]

Tooling, not model runtime: never copied into a checkpoint.
"""

import argparse
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only; no display needed
import matplotlib.pyplot as plt  # noqa: E402
import torch  # noqa: E402


def plot_head_importances(importances, tokens: list[str], path: str | Path, *, title: str | None = None,
                          token_axis_label: str = "source token") -> Path:
    """DHICM's Figure 3: the importance each token (rows) gives each head (columns), brighter = more important.

    importances: [tokens, heads] (a tensor or array; rows sum to 1)."""
    values = torch.as_tensor(importances).detach().float().cpu()
    if values.ndim != 2 or values.shape[0] != len(tokens):
        raise ValueError(f"importances must be [tokens, heads] with one row per token ({len(tokens)} tokens), "
                         f"got shape {tuple(values.shape)}")
    num_tokens, num_heads = values.shape
    figure, axes = plt.subplots(figsize=(1.2 + 0.8 * num_heads, 1.0 + 0.35 * num_tokens))
    image = axes.imshow(values.numpy(), cmap="viridis", vmin=0.0, vmax=1.0, aspect="auto")
    axes.set_xticks(range(num_heads), [f"head {h + 1}" for h in range(num_heads)])
    axes.set_yticks(range(num_tokens), tokens)
    axes.set_xlabel("head")
    axes.set_ylabel(token_axis_label)
    if title:
        axes.set_title(title)
    figure.colorbar(image, ax=axes, label="importance")
    figure.tight_layout()
    path = Path(path)
    figure.savefig(path, dpi=150)
    plt.close(figure)
    return path


def head_importance_figure(model, tokenizer, sentence: str, path: str | Path, module: str | None = None) -> Path:
    """Translate `sentence` greedily and plot one DHICM module's head importances: `module` defaults to the
    last encoder self-attention module that has them (the paper's Figure 3). Encoder modules are labelled with
    the source tokens, decoder modules with the generated tokens they produced."""
    batch = tokenizer([sentence], return_tensors="pt")
    with torch.no_grad():
        generated = model.generate(**batch, num_beams=1, do_sample=False, output_head_importances=True)
    importances = generated.head_importances or {}
    if not importances:
        raise ValueError("This model has no DHICM module, so there are no head importances to plot")
    if module is None:
        encoder_modules = [name for name in importances if name.startswith("encoder.")]
        module = (encoder_modules or list(importances))[-1]
    if module not in importances:
        raise ValueError(f"No head importances for module {module!r}; modules with them: {', '.join(importances)}")
    if module.startswith("encoder."):
        tokens = tokenizer.convert_ids_to_tokens(batch["input_ids"][0])
        label = "source token"
    else:
        tokens = tokenizer.convert_ids_to_tokens(generated.sequences[0, 1:])
        label = "generated token"
    values = importances[module][0, : len(tokens)]
    return plot_head_importances(values, tokens, path, title=module, token_axis_label=label)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    heads = commands.add_parser("head-importances", help="DHICM head importances of one sentence (Figure 3)")
    heads.add_argument("--model", required=True, help="saved model folder (loaded through its own code)")
    heads.add_argument("--sentence", required=True)
    heads.add_argument("--module", default=None, help="e.g. encoder.layers.5.self_attn (default: last encoder one)")
    heads.add_argument("--output", required=True, help="PNG file to write")
    args = parser.parse_args(argv)

    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

    model = AutoModelForSeq2SeqLM.from_pretrained(args.model, trust_remote_code=True).eval()
    tokenizer = AutoTokenizer.from_pretrained(args.model, trust_remote_code=True)
    print(head_importance_figure(model, tokenizer, args.sentence, args.output, args.module))


if __name__ == "__main__":
    main()
