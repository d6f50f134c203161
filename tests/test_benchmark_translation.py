"""examples/benchmark_alignment.py and examples/benchmark_averaging.py on the toy corpus with tiny models: each
records its results and puts its table into RESULTS.md between markers that benchmark_quality's report keeps."""

import json

import pytest

from helpers import load_example, toy_data

TINY = "--max_steps 4 --vocab_size 200 --max_length 12 --max_tokens 400 --warmup_steps 1"


def data_flags(data):
    flags = []
    for split in ("train", "valid", "test"):
        flags += [f"--{split}-source", str(data[f"{split}.src"]), f"--{split}-target", str(data[f"{split}.tgt"])]
    return flags


def test_aer_counts_common_links_against_both_link_sets():
    script = load_example("benchmark_alignment")
    predicted, reference = [{(0, 0), (1, 1), (2, 1)}, set()], [{(0, 0), (1, 1)}, {(0, 0)}]
    scores = script.alignment_scores(predicted, reference)
    assert scores["aer"] == pytest.approx(100 * (1 - 2 * 2 / (3 + 3)))
    assert scores["precision"] == pytest.approx(100 * 2 / 3) and scores["recall"] == pytest.approx(100 * 2 / 3)
    assert script.alignment_scores(reference, reference)["aer"] == 0
    assert script.links_of("0-1 2-3") == {(0, 1), (2, 3)} and script.links_of("") == set()


def test_report_sections_are_replaced_in_place_and_kept_by_the_quality_report(tmp_path):
    quality = load_example("benchmark_quality")
    report = tmp_path / "RESULTS.md"
    report.write_text("# Results\n\ntables\n")
    quality.replace_section(report, "alignment", "## AER\n\nold")
    quality.replace_section(report, "averaging", "## Averaging\n\nfirst")
    quality.replace_section(report, "alignment", "## AER\n\nnew")
    text = report.read_text()
    assert text.startswith("# Results\n\ntables\n\n") and "old" not in text and text.count("## AER") == 1
    assert text.index("## AER") < text.index("## Averaging")
    assert [section.splitlines()[1] for section in quality.kept_sections(report)] == ["## AER", "## Averaging"]
    with pytest.raises(ValueError, match="Unknown report section"):
        quality.replace_section(report, "speed", "x")


def test_alignment_benchmark_end_to_end(tmp_path):
    data = toy_data(tmp_path / "data")
    script = load_example("benchmark_alignment")
    script.main([*data_flags(data), "--systems", "transformer softmax", "lstm 2x2 dependent", "--reference-runs", "2",
                 "--output-dir", str(tmp_path / "runs"), "--records-dir", str(tmp_path / "records"),
                 "--results-file", str(tmp_path / "RESULTS.md"),
                 "--transformer-flags", f"{TINY} --d_model 16 --ffn_dim 32",
                 "--lstm-flags", f"{TINY} --embedding_size 16 --hidden_size 16"])
    record = json.loads((tmp_path / "records" / "transformer-softmax-seed-1.json").read_text())
    assert [row["layer"] for row in record["rows"]] == [0, 1, 2] and record["reference_runs"] == 2
    assert all(0 <= row["aer"] <= 100 for row in record["rows"])
    lstm = json.loads((tmp_path / "records" / "lstm-2x2-dependent-seed-1.json").read_text())
    assert [row["heads"] for row in lstm["rows"]] == ["mean", "hop"]  # dependent hops have weights over heads
    text = (tmp_path / "RESULTS.md").read_text()
    assert "## Word alignments from attention (AER)" in text and "| transformer softmax | 1 | 2 (default) | mean |" in text
    assert "| lstm 2x2 dependent | 1 | (one attention) (default) | mean |" in text
    (tmp_path / "RESULTS.md").write_text("# Results\n")
    script.main(["--report-only", "--records-dir", str(tmp_path / "records"), "--results-file",
                 str(tmp_path / "RESULTS.md")])
    assert (tmp_path / "RESULTS.md").read_text().startswith("# Results\n\n<!-- section written by")
    assert "| diagonal (position only) |" in text and "| eflomal, another run |" in text


def test_averaging_benchmark_end_to_end(tmp_path):
    data = toy_data(tmp_path / "data")
    script = load_example("benchmark_averaging")
    script.main([*data_flags(data), "--seeds", "1", "--last", "2", "--output-dir", str(tmp_path / "runs"),
                 "--records-dir", str(tmp_path / "records"), "--results-file", str(tmp_path / "RESULTS.md"),
                 "--transformer-flags", f"{TINY} --d_model 16 --ffn_dim 32", "--checkpoint-flags", "--save_steps 1"])
    record = json.loads((tmp_path / "records" / "seed-1.json").read_text())
    assert record["averaged"] == ["checkpoint-3", "checkpoint-4"]
    assert (tmp_path / "runs" / "seed-1-average2" / "averaged_from.json").is_file()
    for decoding in ("greedy", "beam5"):
        assert record[decoding]["gain"] == pytest.approx(record[decoding]["average"] - record[decoding]["last"])
        assert 0 < record[decoding]["p"] <= 1
    assert "## Checkpoint averaging" in (tmp_path / "RESULTS.md").read_text()
