"""examples/benchmark_quality.py end to end on the toy corpus: two systems (one per family) trained, evaluated,
tabulated in RESULTS.md and written into model cards that parse back to the measured numbers."""

import json
from pathlib import Path

import pytest
from huggingface_hub import ModelCard

from helpers import load_example, toy_data


@pytest.fixture(scope="module")
def quality_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("quality")
    data = toy_data(tmp / "data")
    script = load_example("benchmark_quality")
    files = []
    for split in ("train", "valid", "test"):
        files += [f"--{split}-source", str(data[f"{split}.src"]), f"--{split}-target", str(data[f"{split}.tgt"])]
    args = [*files, "--output-dir", str(tmp / "runs"), "--results-file", str(tmp / "RESULTS.md"),
            "--cards-dir", str(tmp / "cards"), "--train-pairs", "200", "--vocab-size", "200", "--epochs", "1",
            "--batch-size", "32", "--warmup-steps", "1", "--d-model", "16", "--embedding-size", "16",
            "--hidden-size", "16", "--num-beams", "2", "--dataset-name", "Toy German-English",
            "--dataset-id", "hf-headattn/toy-de-en"]
    script.main([*args, "--systems", "transformer softmax", "lstm baseline 1x1"])
    return script, tmp, args


def test_results_table_holds_every_measured_system(quality_run):
    _, tmp, _ = quality_run
    text = (tmp / "RESULTS.md").read_text()
    for system in ("transformer softmax", "lstm baseline 1x1"):
        result = json.loads((tmp / "runs" / system.replace(" ", "-") / "quality_result.json").read_text())
        evaluation = json.loads(Path(result["evaluation_json"]).read_text())
        assert result["bleu"] == evaluation["bleu"] and result["drop"] == evaluation["drop"]
        row = f"| {system} | {result['bleu']:.2f} | {result['chrf']:.2f} | {result['ter']:.2f} | {result['rep']:.2f} |"
        assert row in text
        assert f"{result['parameters']:,}" in text
    assert "--systems 'transformer softmax' 'lstm baseline 1x1'" in text  # the command that produced the table
    assert "1 epochs at batch size 32" in text


def test_cards_carry_the_system_results_and_the_comparison(quality_run):
    _, tmp, _ = quality_run
    for system in ("transformer-softmax", "lstm-baseline-1x1"):
        card_path = tmp / "cards" / f"{system}.md"
        assert card_path.read_text() == (tmp / "runs" / system / "README.md").read_text()
        card = ModelCard.load(card_path)
        result = json.loads((tmp / "runs" / system / "quality_result.json").read_text())
        bleu = [r for r in card.data.eval_results if r.metric_type == "bleu"]
        assert bleu and bleu[0].metric_value == pytest.approx(result["bleu"], abs=0.01)
        assert "Compared with the other variants" in card.text and "lstm baseline 1x1" in card.text


def test_systems_trained_with_other_settings_are_refused(quality_run):
    script, tmp, args = quality_run
    path = tmp / "runs" / "lstm-baseline-1x1" / "quality_result.json"
    original = path.read_text()
    changed = json.loads(original)
    changed["settings"]["epochs"] = 2.0
    path.write_text(json.dumps(changed))
    try:
        with pytest.raises(ValueError, match="different settings"):
            script.main([*args, "--report-only"])
    finally:
        path.write_text(original)


def test_every_registered_variant_has_a_system():
    from hf_headattn.runtime.attention_registry import ATTENTION_VARIANTS

    assert set(load_example("benchmark_quality").TRANSFORMER_SYSTEMS) == set(ATTENTION_VARIANTS)


def test_half_given_data_files_are_an_error(tmp_path, capsys):
    with pytest.raises(SystemExit):
        load_example("benchmark_quality").main(["--train-source", str(tmp_path / "a.de"), "--output-dir", str(tmp_path)])
    assert "all six" in capsys.readouterr().err
