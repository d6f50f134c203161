r"""Figures for analysing trained models, written to PNG with matplotlib (Agg backend: files only, no display).

    # DHICM's Figure 3: one DHICM module's head importances for one sentence
    python -m hf_headattn.plotting head-importances --model runs/dhicm --sentence "ein hund läuft ." \
        --output head_importances.png [--module encoder.layers.5.self_attn]
    # --model takes a local folder; a Hugging Face Hub id also needs --trust_remote_code (its code would run here)
    # cross-attention map of one sentence (DHICM's Figures 1-2, Malaviya et al.'s Figure 2); either model family
    python -m hf_headattn.plotting attention-map --model runs/de-en --sentence "ein hund läuft ." \
        --output attention.png [--layer -1] [--heads mean|all] [--target "a dog runs ."]
    # BLEU by source length of several systems (Cui et al.'s Figure 2), from evaluation JSONs
    python -m hf_headattn.plotting bleu-by-length --results runs/a/eval/test.beam4.metrics.json \
        runs/b/eval/test.beam4.metrics.json --labels softmax MMA --output bleu_by_length.png
    # each head's learned alpha of alpha-entmax models, per site and layer (Correia et al.'s Figure 2)
    python -m hf_headattn.plotting learned-alphas --models runs/entmax-alpha-1 runs/entmax-alpha-2 \
        --output learned_alphas.png

Every plotting function saves the PNG and returns its path, or the matplotlib Figure with
``return_figure=True`` (to inspect or restyle it; it is already saved and detached from pyplot).

Tooling, not model runtime: never copied into a checkpoint.
"""

import math
from collections.abc import Mapping, Sequence
from pathlib import Path

from .output_files import new_file
from .translation.alignments import alignment_layer_index  # a cross-attention layer, negative from the top


# matplotlib and torch are imported where they are used, so that `--help` is instant.


ATTENTION_HEADS = ("mean", "all")
SOURCE_AXIS_LABEL = "source tokens"
TARGET_AXIS_LABEL = "target tokens"
LENGTH_AXIS_LABEL = "source length (words)"
BLEU_AXIS_LABEL = "BLEU"


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")  # files only; no display needed
    import matplotlib.pyplot as plt

    return plt


def _save(figure, path: str | Path, return_figure: bool):
    """Write the PNG; close the figure in pyplot (so figures do not pile up) and return the path or the figure."""
    path = Path(path)
    with new_file(path, binary=True) as handle:  # whole or not at all
        figure.savefig(handle, format=path.suffix.lstrip(".") or "png", dpi=150)
    _pyplot().close(figure)
    return figure if return_figure else path


# ------------------------------------------------------------------------------------------------ head importances
def plot_head_importances(importances, tokens: list[str], path: str | Path, *, title: str | None = None,
                          token_axis_label: str = "source token", return_figure: bool = False):
    """DHICM's Figure 3: the importance each token (rows) gives each head (columns), brighter = more important.

    importances: [tokens, heads] (a tensor or array; rows sum to 1)."""
    import torch

    values = torch.as_tensor(importances).detach().float().cpu()
    if values.ndim != 2 or values.shape[0] != len(tokens):
        raise ValueError(f"importances must be [tokens, heads] with one row per token ({len(tokens)} tokens), "
                         f"got shape {tuple(values.shape)}")
    num_tokens, num_heads = values.shape
    figure, axes = _pyplot().subplots(figsize=(1.2 + 0.8 * num_heads, 1.0 + 0.35 * num_tokens))
    image = axes.imshow(values.numpy(), cmap="viridis", vmin=0.0, vmax=1.0, aspect="auto")
    axes.set_xticks(range(num_heads), [f"head {h + 1}" for h in range(num_heads)])
    axes.set_yticks(range(num_tokens), tokens)
    axes.set_xlabel("head")
    axes.set_ylabel(token_axis_label)
    if title:
        axes.set_title(title)
    figure.colorbar(image, ax=axes, label="importance")
    figure.tight_layout()
    return _save(figure, path, return_figure)


def head_importance_figure(model, tokenizer, sentence: str, path: str | Path, module: str | None = None, *,
                           return_figure: bool = False):
    """Translate `sentence` greedily and plot one DHICM module's head importances: `module` defaults to the
    last encoder self-attention module that has them (the paper's Figure 3). Encoder modules are labelled with
    the source tokens, decoder modules with the generated tokens they produced."""
    import torch

    batch = tokenizer([sentence], return_tensors="pt").to(model.device)
    generation_config = model.generation_config
    # the model's own length limit if it has one; else a bound from the source, not generate's silent default of 20
    own_limit = generation_config.max_new_tokens is not None or "max_length" in generation_config.to_diff_dict()
    limit = {} if own_limit else {"max_new_tokens": 2 * batch["input_ids"].shape[1] + 10}
    with torch.no_grad():
        generated = model.generate(**batch, num_beams=1, do_sample=False, output_head_importances=True, **limit)
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
    return plot_head_importances(values, tokens, path, title=module, token_axis_label=label,
                                 return_figure=return_figure)


# ------------------------------------------------------------------------------------------------ attention maps
def cross_attention_weights(model, tokenizer, sentence: str, *, layer: int = -1, target: str | None = None,
                            num_beams: int = 1, max_new_tokens: int | None = None):
    """One sentence's cross-attention weights of one decoder layer, for either model family.

    The target is the model's own translation (``generate`` with `num_beams`), or `target` when given (e.g. the
    reference). Its attention comes from one teacher-forced pass over it, which equals what decoding computed:
    each step depends only on the source and the target prefix.

    Returns:
        ``(weights, source_tokens, target_tokens, layer_name)``: weights ``[heads, target tokens, source tokens]``;
        row t is the attention while predicting target token t; `layer_name` e.g. ``"decoder.layers.2.encoder_attn"``
        (Transformer) or ``"source attention"`` (LSTM, which has one).
    """
    import torch

    batch = tokenizer([sentence], return_tensors="pt").to(model.device)
    start = torch.tensor([model.config.decoder_start_token_id], device=model.device)
    if target is None:
        generation = {"max_new_tokens": max_new_tokens} if max_new_tokens is not None else {}
        with torch.no_grad():
            sequence = model.generate(**batch, num_beams=num_beams, do_sample=False, **generation)[0]
        target_ids = sequence[1:]  # drop the decoder start token
        target_ids = target_ids[target_ids != model.config.pad_token_id]
    else:
        target_ids = tokenizer(text_target=[target], return_tensors="pt")["input_ids"][0].to(model.device)
    if len(target_ids) == 0:
        raise ValueError(f"The target of {sentence!r} is empty: nothing to plot")
    decoder_input_ids = torch.cat([start, target_ids[:-1]])[None]
    with torch.no_grad():
        outputs = model(**batch, decoder_input_ids=decoder_input_ids, output_attentions=True, use_cache=False)
    layers = outputs.cross_attentions or ()
    if not -len(layers) <= layer < len(layers):
        raise ValueError(f"layer={layer} is out of range: this model returns {len(layers)} cross-attention layer(s), "
                         f"so layers in [{-len(layers)}, {len(layers) - 1}] are accepted")
    weights = layers[layer]
    layer_index = layer % len(layers)
    config = model.config
    layer_name = (config.cross_attention_module(layer_index) if hasattr(config, "cross_attention_module")
                  else f"decoder layer {layer_index}")
    if weights is None:
        raise ValueError(f"The cross-attention variant of {layer_name} returns no attention weights to plot")
    source_tokens = tokenizer.convert_ids_to_tokens(batch["input_ids"][0])
    target_tokens = tokenizer.convert_ids_to_tokens(target_ids)
    return weights[0].detach().float().cpu(), source_tokens, target_tokens, layer_name


def plot_attention_map(model, tokenizer, sentence: str, path: str | Path, *, layer: int = -1, heads: str = "mean",
                       target: str | None = None, num_beams: int = 1, max_new_tokens: int | None = None,
                       title: str | None = None, return_figure: bool = False):
    """Cross-attention map of one sentence (DHICM's Figures 1-2; Malaviya et al.'s Figure 2): source tokens on the
    x axis, target tokens on the y axis, white = no attention.

    Works for both model families (the Transformer's decoder layers, chosen with `layer`, negative counting from
    the top; the LSTM's single source attention, layer 0 or -1). `heads="mean"` draws the mean over the heads in
    one panel, `heads="all"` one panel per head. The target is the model's translation (greedy unless
    `num_beams` > 1) or `target`; see :func:`cross_attention_weights`."""
    if heads not in ATTENTION_HEADS:
        raise ValueError(f"heads={heads!r}; accepted: {', '.join(ATTENTION_HEADS)}")
    weights, source_tokens, target_tokens, layer_name = cross_attention_weights(
        model, tokenizer, sentence, layer=layer, target=target, num_beams=num_beams, max_new_tokens=max_new_tokens)
    num_heads = weights.shape[0]
    if heads == "mean":
        panels = [(f"mean of {num_heads} head{'s' * (num_heads > 1)}", weights.mean(dim=0))]
    else:
        head_numbers = _original_head_numbers(model.config, alignment_layer_index(model, layer), num_heads)
        panels = [(f"head {number}", weights[h]) for h, number in enumerate(head_numbers)]

    columns = min(len(panels), 4)
    rows = math.ceil(len(panels) / columns)
    cell_width, cell_height = 1.0 + 0.32 * len(source_tokens), 1.0 + 0.3 * len(target_tokens)
    figure, axes_grid = _pyplot().subplots(rows, columns, figsize=(cell_width * columns + 1.2, cell_height * rows + 0.8),
                                     squeeze=False, layout="constrained")
    for axes, (panel_title, values) in zip(axes_grid.flat, panels):
        image = axes.imshow(values.numpy(), cmap="Greys", vmin=0.0, vmax=1.0, aspect="auto")
        axes.set_xticks(range(len(source_tokens)), source_tokens, rotation=90)
        axes.set_yticks(range(len(target_tokens)), target_tokens)
        axes.set_xlabel(SOURCE_AXIS_LABEL)
        axes.set_ylabel(TARGET_AXIS_LABEL)
        axes.set_title(panel_title)
    for axes in list(axes_grid.flat)[len(panels):]:
        axes.remove()
    figure.colorbar(image, ax=list(figure.axes), label="attention")
    figure.suptitle(title or f"cross-attention: {layer_name}")
    return _save(figure, path, return_figure)


def _original_head_numbers(config, layer_index: int, num_heads: int) -> list[int]:
    """1-based head numbers as the unpruned model counted them (a pruned Transformer module keeps some heads)."""
    if hasattr(config, "cross_attention_heads"):
        kept = config.cross_attention_heads(layer_index)
        if len(kept) == num_heads:
            return [head + 1 for head in kept]
    return list(range(1, num_heads + 1))


# ------------------------------------------------------------------------------------------------ BLEU by length
def load_bleu_by_length(results_path: str | Path) -> dict[str, dict]:
    """System name -> its ``bleu_by_length`` dict, from a JSON file of either kind the project writes:

    - an evaluation JSON (:func:`hf_headattn.evaluation.evaluate_model`): one system, named after its model folder;
    - a results JSON of the example scripts, ``{"results": {system: {..., "bleu_by_length": ...}}}``: each system.
    """
    from .evaluation import read_metrics_json

    path = Path(results_path)
    results = read_metrics_json(path, what="Results file")  # JSON, every number finite (or refused naming it)
    if isinstance(results, Mapping) and "bleu_by_length" in results:
        name = results.get("model", {}).get("name") or path.stem
        return {name: results["bleu_by_length"]}
    systems = results.get("results") if isinstance(results, Mapping) else None
    if isinstance(systems, Mapping) and systems and all(
        isinstance(scores, Mapping) and "bleu_by_length" in scores for scores in systems.values()
    ):
        return {name: scores["bleu_by_length"] for name, scores in systems.items()}
    raise ValueError(f"{path} holds no BLEU by length: expected an evaluation JSON with a 'bleu_by_length' key "
                     "(hf_headattn.evaluation) or {'results': {system: {'bleu_by_length': ...}}}")


def plot_bleu_by_length(systems: Mapping[str, Mapping], path: str | Path, *, title: str | None = None,
                        return_figure: bool = False):
    """BLEU per source-length bucket, one line per system (Cui et al.'s Figure 2).

    systems: label -> a ``bleu_by_length`` dict (:func:`hf_headattn.metrics.bleu_by_length`: bucket label ->
        ``{"count", "bleu"}``), or a whole evaluation result that contains one. All systems must use the same
        buckets. Empty buckets (``bleu`` None) leave a gap; the x tick labels give each bucket's sentence count
        when it is the same for every system (one test set)."""
    if not isinstance(systems, Mapping) or not systems:
        raise ValueError("systems must be a non-empty mapping label -> bleu_by_length dict")
    curves = {label: (scores["bleu_by_length"] if "bleu_by_length" in scores else scores)
              for label, scores in systems.items()}
    buckets = None
    for label, curve in curves.items():
        if not isinstance(curve, Mapping) or not all(isinstance(v, Mapping) and "bleu" in v for v in curve.values()):
            raise ValueError(f"System {label!r}: expected a bleu_by_length dict (bucket -> {{'count', 'bleu'}})")
        for bucket, scores in curve.items():
            bleu = scores["bleu"]
            if bleu is not None and (isinstance(bleu, bool) or not isinstance(bleu, (int, float))
                                     or not math.isfinite(bleu)):
                raise ValueError(f"System {label!r}: bleu_by_length.{bucket}.bleu is {bleu!r}; a plotted BLEU is a "
                                 "finite number (null: an empty bucket, left as a gap)")
        if buckets is None:
            buckets, first = list(curve), label
        elif list(curve) != buckets:
            raise ValueError(f"Systems use different length buckets: {first!r} has {buckets}, {label!r} has "
                             f"{list(curve)}; evaluate them with the same buckets")
    counts = {tuple(curve[b].get("count") for b in buckets) for curve in curves.values()}
    ticks = buckets
    if len(counts) == 1 and None not in next(iter(counts)):
        ticks = [f"{bucket}\n(n={count})" for bucket, count in zip(buckets, next(iter(counts)))]

    figure, axes = _pyplot().subplots(figsize=(max(5.0, 1.1 * len(buckets) + 2.0), 4.0))
    for label, curve in curves.items():
        values = [math.nan if curve[b]["bleu"] is None else curve[b]["bleu"] for b in buckets]
        axes.plot(range(len(buckets)), values, marker="o", label=label)
    axes.set_xticks(range(len(buckets)), ticks)
    axes.set_xlabel(LENGTH_AXIS_LABEL)
    axes.set_ylabel(BLEU_AXIS_LABEL)
    axes.grid(alpha=0.3)
    axes.legend()
    if title:
        axes.set_title(title)
    figure.tight_layout()
    return _save(figure, path, return_figure)


def systems_from_files(paths: Sequence[str | Path], labels: Sequence[str] | None) -> dict[str, dict]:
    systems: dict[str, dict] = {}
    for path in paths:
        for name, curve in load_bleu_by_length(path).items():
            unique, suffix = name, 2
            while unique in systems:  # two evaluations of models with the same folder name
                unique, suffix = f"{name} ({suffix})", suffix + 1
            systems[unique] = curve
    if labels:
        if len(labels) != len(systems):
            raise ValueError(f"{len(labels)} labels for {len(systems)} systems ({', '.join(systems)})")
        systems = dict(zip(labels, systems.values()))
    return systems


# ------------------------------------------------------------------------------------------------ learned alphas
def learned_alphas(model) -> dict[str, dict]:
    """Each attention module's learned alpha per head (alpha-entmax with alpha learned, Correia et al., 2019):
    module name -> {"site", "layer" (from 0), "alphas" (one a head)}. Modules with a fixed alpha, or none, are left
    out; a model without learned alphas gives {}."""
    import torch

    found = {}
    for name, module in model.named_modules():
        head_alphas = getattr(module, "head_alphas", None)
        alphas = head_alphas() if callable(head_alphas) else None
        if torch.is_tensor(alphas):
            found[name] = {"site": module.site, "layer": module.layer_idx,
                           "alphas": [round(alpha, 6) for alpha in alphas.detach().float().cpu().tolist()]}
    return found


def plot_learned_alphas(runs: Mapping[str, Mapping[str, dict]], path: str | Path, *, title: str | None = None,
                        return_figure: bool = False):
    """Correia et al.'s Figure 2: every head's learned alpha (y, from 1, softmax, to 2, sparsemax) by layer (x), one
    panel per attention site, one marker per run (e.g. per seed); `runs` maps a label to :func:`learned_alphas`."""
    sites = list(dict.fromkeys(module["site"] for modules in runs.values() for module in modules.values()))
    if not sites:
        raise ValueError(f"no learned alphas in {', '.join(runs) or 'no models'}: only alpha-entmax attention with "
                         "alpha learned (entmax_alpha without a fixed `alpha`) has them")
    plt = _pyplot()
    figure, axes = plt.subplots(1, len(sites), figsize=(4 * len(sites), 3.6), sharey=True, squeeze=False)
    markers = "os^Dv<>p"
    for axis, site in zip(axes[0], sites):
        for run_index, (label, modules) in enumerate(runs.items()):
            points = [(module["layer"] + 1, alpha) for module in modules.values() if module["site"] == site
                      for alpha in module["alphas"]]
            offset = (run_index - (len(runs) - 1) / 2) * 0.12  # runs side by side within a layer
            axis.scatter([layer + offset for layer, _ in points], [alpha for _, alpha in points], s=18, alpha=0.75,
                         marker=markers[run_index % len(markers)], label=label)
        axis.axhline(1.5, color="grey", linewidth=0.8, linestyle="--")  # where every learned alpha starts
        axis.set_title(site.replace("_", " "))
        axis.set_xlabel("layer")
        layers = sorted({module["layer"] + 1 for modules in runs.values() for module in modules.values()
                         if module["site"] == site})
        axis.set_xticks(layers)
        axis.set_ylim(0.98, 2.02)
    axes[0][0].set_ylabel("learned alpha (1: softmax, 2: sparsemax)")
    if len(runs) > 1:
        axes[0][-1].legend(fontsize="small")
    if title:
        figure.suptitle(title)
    figure.tight_layout()
    return _save(figure, path, return_figure)

