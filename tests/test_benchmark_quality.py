"""examples/benchmark_quality.py end to end on the toy corpus: a Transformer pair and an LSTM pair (system and
baseline, two seeds each) trained by the package's command with the anchor preset shrunk by extra flags, evaluated
greedy and beam 5, recorded, tabulated in RESULTS.md with paired bootstrap p-values, and carded."""

import json
import statistics
from pathlib import Path

import pytest
from huggingface_hub import ModelCard

from helpers import load_example, toy_data

SMALL = ("--max_steps 4 --vocab_size 200 --max_length 12 --max_tokens 400 --warmup_steps 1 --eval_steps 2 "
         "--save_steps 2 --logging_steps 1")
SYSTEMS = ["transformer softmax", "transformer mma", "lstm baseline 1x1", "lstm 2x2 dependent"]


@pytest.fixture(scope="module")
def quality_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("quality")
    data = toy_data(tmp / "data")
    script = load_example("benchmark_quality")
    files = []
    for split in ("train", "valid", "test"):
        files += [f"--{split}-source", str(data[f"{split}.src"]), f"--{split}-target", str(data[f"{split}.tgt"])]
    args = [*files, "--output-dir", str(tmp / "runs"), "--records-dir", str(tmp / "records"),
            "--results-file", str(tmp / "RESULTS.md"), "--cards-dir", str(tmp / "cards"),
            "--transformer-flags", f"{SMALL} --d_model 16 --ffn_dim 32",
            "--lstm-flags", f"{SMALL} --embedding_size 16 --hidden_size 16",
            "--dataset-name", "Toy German-English", "--dataset-id", "hf-headattn/toy-de-en"]
    script.main([*args, "--systems", *SYSTEMS, "--seeds", "1", "2"])
    script.main([*args, "--systems", "transformer dhicm", "--seeds", "1"])
    return script, tmp, args


def test_every_run_is_recorded_with_what_reproduces_it(quality_run):
    _, tmp, _ = quality_run
    for system in SYSTEMS:
        for seed in (1, 2):
            record = tmp / "records" / system.replace(" ", "-") / f"seed-{seed}"
            result = json.loads((record / "result.json").read_text())
            assert result["steps"] == 4 and result["seed"] == seed
            assert "--preset multi30k-anchor" in result["training_command"]
            assert f"--seed {seed}" in result["training_command"] and "--max_steps 4" in result["training_command"]
            for decoding in ("greedy", "beam5"):
                metrics = json.loads((record / result["decoding"][decoding]["metrics"]).read_text())
                assert metrics["bleu"] == result["decoding"][decoding]["bleu"]
                assert metrics["decoding"]["num_beams"] == (1 if decoding == "greedy" else 5)
                assert len((record / result["decoding"][decoding]["hypotheses"]).read_text().splitlines()) == 12


def test_report_has_each_table_and_the_p_values(quality_run):
    _, tmp, _ = quality_run
    text = (tmp / "RESULTS.md").read_text()
    result = json.loads((tmp / "records" / "transformer-softmax" / "seed-1" / "result.json").read_text())
    assert f"| transformer softmax | 1 | 4 | **{result['decoding']['greedy']['bleu']:.2f}** | 36.4 |" in text  # the anchor table
    greedy = [json.loads((tmp / "records" / "transformer-softmax" / f"seed-{seed}" / "result.json").read_text())
              ["decoding"]["greedy"]["bleu"] for seed in (1, 2)]
    assert (f"Not reached: softmax's greedy BLEU with the preset's global length sort is {statistics.mean(greedy):.2f} "
            f"± {statistics.stdev(greedy):.2f} over 2 seeds") in text  # judged on the mean, not the best seed
    for system in SYSTEMS:
        assert f"| {system} |" in text
    assert "### MMA vs softmax (Cui et al.)" in text and "### 2x2 dependent multi-hop" in text
    assert "Seeds: 1, 2." in text
    row = next(line for line in text.splitlines() if line.startswith("| transformer mma |") and "±" in line)
    p_values = [float(p) for cell in row.split("|")[4:6] for p in cell.split(",")]
    assert len(p_values) == 4 and all(0 <= p <= 1 for p in p_values)
    assert (tmp / "records" / "bleu_by_length.png").stat().st_size > 0
    dhicm = json.loads((tmp / "records" / "transformer-dhicm" / "seed-1" / "result.json").read_text())
    assert sorted(dhicm["head_importances"]) == ["decoder.layers.2.encoder_attn", "decoder.layers.2.self_attn",
                                                 "encoder.layers.2.self_attn"]
    kl = dhicm["head_importances"]["encoder.layers.2.self_attn"]["mean_kl"]
    assert f"| transformer dhicm | 1 | encoder.layers.2.self_attn | {kl:.3f} |" in text
    assert "--systems 'transformer softmax' --seeds 1" in text
    # every row names where it trained, the claims per seed
    script = quality_run[0]
    machine = script.machine_label(result)
    if not result["machine_at_start"]["cuda"]:
        assert machine == f"CPU, {result['machine_at_start']['cpu_count']} cores"
    assert f"| {result['train_runtime_s'] / 60:.0f} ({machine}) |" in text
    assert row.endswith(f" ({machine}) |") and f"min on {machine}, load average" in text


def test_coverage_claims_get_rep_and_drop_p_values_from_the_recorded_hypotheses(quality_run, monkeypatch):
    script, tmp, _ = quality_run
    monkeypatch.setattr(script, "CLAIMS", [("coverage of MMA", "transformer mma", "transformer softmax", "coverage")])
    results = script.collect(tmp / "records")
    references = (tmp / "data" / "test.tgt").read_text(encoding="utf-8").splitlines()
    text = script.claims_tables(results, references)
    row = next(line for line in text.splitlines() if line.startswith("| transformer mma |"))
    p_values = [float(p) for cell in row.split("|")[5:8] for p in cell.split(",")]  # BLEU, REP, DROP; 2 seeds
    assert len(p_values) == 6 and all(0 < p <= 1 for p in p_values)
    assert "the DROP those counts give is within 0.00 of the recorded DROP" in text  # the evaluations' alignments
    # the counts are kept beside each record and read by every later report: no alignment again
    result = results["transformer mma", 1]
    kept = result["record_dir"] / result["decoding"]["beam5"]["metrics"].replace(".metrics.json", ".drop_counts.json")
    assert len(json.loads(kept.read_text())["sentence_counts"]) == len(references)

    def no_alignment(*args, **kwargs):
        raise AssertionError("DROP aligned again")

    with monkeypatch.context() as patched:
        patched.setattr(script, "drop_details", no_alignment)
        assert script.claims_tables(results, references) == text
    # the counts are recomputed from the hypotheses, which must still give the recorded scores
    hypotheses = tmp / "records" / "transformer-mma" / "seed-2" / results["transformer mma", 2]["decoding"]["beam5"][
        "hypotheses"]
    original = hypotheses.read_text(encoding="utf-8")
    hypotheses.write_text("".join("we we we we\n" for _ in original.splitlines()), encoding="utf-8")
    try:
        changed = r"transformer mma seed 2 \(beam5\): the recorded hypotheses give (BLEU|REP)"
        with pytest.raises(RuntimeError, match=changed):
            script.claims_tables(results, references)
    finally:
        hypotheses.write_text(original, encoding="utf-8")


def test_alignment_claims_give_the_aer_where_alignments_are_read_by_default(quality_run, monkeypatch, tmp_path):
    script, tmp, _ = quality_run
    monkeypatch.setattr(script, "CLAIMS", [("guidance", "transformer mma", "transformer softmax", "alignment")])
    results = script.collect(tmp / "records")
    references = (tmp / "data" / "test.tgt").read_text(encoding="utf-8").splitlines()
    rows = [{"layer": layer, "heads": heads, "aer": aer} for layer, heads, aer in
            [(0, "mean", 60.0), (1, "mean", 23.5), (1, "all", 33.0), (2, "mean", 44.0)]]
    for seed, shift in ((1, 0.0), (2, 1.0)):  # a guided model: its guided heads at its guided layer
        record = {"default_layer": 1, "guided_heads": [0], "rows": [{**row, "aer": row["aer"] + shift} for row in rows]}
        (tmp_path / f"transformer-mma-seed-{seed}.json").write_text(json.dumps(record))
    (tmp_path / "transformer-softmax-seed-1.json").write_text(json.dumps({"rows": rows}))  # the last layer's mean
    text = script.claims_tables(results, references, alignment_dir=tmp_path)
    system = next(line for line in text.splitlines() if line.startswith("| transformer mma |"))
    baseline = next(line for line in text.splitlines() if line.startswith("| transformer softmax |"))
    assert "| 24.00 ± 0.71 (2; layer 1, guided head 0) |" in system
    assert "| 44.00 (1; layer 2, heads' mean) |" in baseline
    (tmp_path / "transformer-softmax-seed-1.json").unlink()
    assert "| not measured |" in script.claims_tables(results, references, alignment_dir=tmp_path)


def test_cards_carry_seed_1_results(quality_run):
    _, tmp, _ = quality_run
    for system in SYSTEMS:
        card = ModelCard.load(tmp / "cards" / f"{system.replace(' ', '-')}.md")
        result = json.loads((tmp / "records" / system.replace(" ", "-") / "seed-1" / "result.json").read_text())
        bleu = [r for r in card.data.eval_results if r.metric_type == "bleu"]
        assert bleu and bleu[0].metric_value == pytest.approx(result["decoding"]["beam5"]["bleu"], abs=0.01)
        model_dir = tmp / "runs" / system.replace(" ", "-") / "seed-1"
        assert f'pipeline("translation", model="{model_dir.as_posix()}", trust_remote_code=True)' in card.text


def test_a_recorded_run_is_skipped_and_other_settings_are_refused_by_the_report(quality_run, capsys):
    script, tmp, args = quality_run
    script.main([*args, "--systems", "transformer softmax", "--seeds", "1"])
    assert "recorded already" in capsys.readouterr().out
    path = tmp / "records" / "lstm-baseline-1x1" / "seed-2" / "result.json"
    original = path.read_text()
    changed = json.loads(original)
    changed["settings"]["extra_flags"] += " --dropout 0.3"
    path.write_text(json.dumps(changed))
    try:
        script.main([*args, "--systems", "transformer softmax", "--seeds", "1", "--no-report"])  # no report, no check
        with pytest.raises(ValueError, match="different settings"):
            script.main([*args, "--systems", "transformer softmax", "--seeds", "1"])
        with pytest.raises(ValueError, match="different settings"):
            script.main([*args, "--report-only"])
    finally:
        path.write_text(original)


def test_every_registered_variant_has_a_system():
    from hf_headattn.runtime.attention_registry import ATTENTION_VARIANTS

    systems = load_example("benchmark_quality").SYSTEMS
    assert {name.split()[1].rstrip(",") for name in systems if name.startswith("transformer")} >= set(ATTENTION_VARIANTS)


def test_half_given_data_files_are_an_error(tmp_path, capsys):
    with pytest.raises(SystemExit):
        load_example("benchmark_quality").main(["--train-source", str(tmp_path / "a.de"), "--output-dir", str(tmp_path)])
    assert "all six" in capsys.readouterr().err


def test_notes_kept_beside_the_records_go_into_the_report(quality_run):
    script, tmp, args = quality_run
    notes = tmp / "records" / "notes.md"
    notes.write_text("A diagnostic run stopped at step 650.\n")
    try:
        script.main([*args, "--report-only"])
        assert "## Notes on these runs\n\nA diagnostic run stopped at step 650.\n\n## Setup" in (tmp / "RESULTS.md").read_text()
    finally:
        notes.unlink()
        script.main([*args, "--report-only"])


def test_the_report_takes_the_same_files_elsewhere_and_runs_of_another_preset(quality_run):
    """Runs recorded on machines that keep the data in other folders, and systems of another preset, are one
    report; a run on other files is refused."""
    script, tmp, args = quality_run
    paths = [tmp / "records" / "lstm-2x2-dependent" / f"seed-{seed}" / "result.json" for seed in (1, 2)]
    originals = [path.read_text() for path in paths]

    def rewrite(change):
        for path, original in zip(paths, originals):
            result = json.loads(original)
            change(result["settings"])
            path.write_text(json.dumps(result))

    def moved(settings):  # the same files in another folder, the system trained by another preset
        settings["data"] = {key: f"/elsewhere/{Path(value).name}" for key, value in settings["data"].items()}
        settings.update(preset_name="malaviya2018", preset={"architecture": "rnn"})

    def other_file(settings):
        moved(settings)
        settings["data"]["test_target"] = "/elsewhere/other.en"

    def other_contents(settings):  # recorded with the hash of a file that is not the one the report reads
        moved(settings)
        settings["data_sha256"] = {**settings["data_sha256"], "train_source": "0" * 64}

    try:
        rewrite(moved)
        script.main([*args, "--report-only"])
        text = (tmp / "RESULTS.md").read_text()
        assert "except the `malaviya2018` systems, trained by `--preset malaviya2018` (--architecture rnn)" in text
        for change in (other_file, other_contents):
            rewrite(change)
            with pytest.raises(ValueError, match="these on other data than .*\nlstm 2x2 dependent seed 1: "):
                script.main([*args, "--report-only"])
    finally:
        for path, original in zip(paths, originals):
            path.write_text(original)
