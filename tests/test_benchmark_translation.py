"""examples/benchmark_alignment.py and examples/benchmark_averaging.py on the toy corpus with tiny models: each
records its results and puts its table into RESULTS.md between markers that benchmark_quality's report keeps."""

import json
import os

import pytest

from helpers import load_example, toy_data, train_tiny_model

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


def test_only_a_run_that_measures_all_of_the_published_report_replaces_it(tmp_path, monkeypatch, capsys):
    quality = load_example("benchmark_quality")
    monkeypatch.chdir(tmp_path)
    committed, markdown = tmp_path / "benchmarks" / "sizes.json", tmp_path / "BENCHMARKS.md"
    sizes = lambda report: {size["pairs"] for size in report["sizes"]}  # noqa: E731

    def run(pairs, **flags):
        report = {"sizes": [{"pairs": n} for n in pairs]}
        options = {"output": None, "markdown": None, "committed": "benchmarks/sizes.json", "rows": sizes, **flags}
        quality.publish(report, "data_prep-intel", f"## Sizes {pairs}", **options)
        return capsys.readouterr()

    run([1, 2, 3])  # the first run: nothing published yet
    assert sizes(json.loads(committed.read_text())) == {1, 2, 3} and "## Sizes [1, 2, 3]" in markdown.read_text()
    printed = run([2])  # fewer sizes: both files stay, and the run says why
    assert sizes(json.loads(committed.read_text())) == {1, 2, 3} and "## Sizes [1, 2, 3]" in markdown.read_text()
    assert "## Sizes [2]" in printed.out and "does not measure 1, 3 of benchmarks/sizes.json" in printed.err
    assert "benchmarks/sizes.json and BENCHMARKS.md left as they are" in printed.err
    assert "left as they are" in run([1, 2, 3], smoke=True).err and "[1, 2, 3]" in markdown.read_text()
    run([1, 2, 3, 4])  # more rows: the published report grows
    assert sizes(json.loads(committed.read_text())) == {1, 2, 3, 4} and "## Sizes [1, 2, 3, 4]" in markdown.read_text()
    # explicit destinations are used as given, also for a partial run; --output alone writes no section
    run([5], output=str(tmp_path / "elsewhere.json"))
    assert sizes(json.loads((tmp_path / "elsewhere.json").read_text())) == {5} and "[5]" not in markdown.read_text()
    run([6], output=str(tmp_path / "six.json"), markdown=str(tmp_path / "six.md"))
    assert "## Sizes [6]" in (tmp_path / "six.md").read_text() and "[6]" not in markdown.read_text()
    printed = run([1], markdown=str(tmp_path / "one.md"))  # the JSON's default still waits for a complete run
    assert "benchmarks/sizes.json left as it is" in printed.err
    assert sizes(json.loads(committed.read_text())) == {1, 2, 3, 4}
    assert "## Sizes [1]" in (tmp_path / "one.md").read_text()
    # a published file that is not this benchmark's report is replaced, and the run says so
    committed.write_text("[1, 2")
    assert "not a report of this benchmark" in run([7]).err and sizes(json.loads(committed.read_text())) == {7}


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
    script.main([*data_flags(data), "--systems", "transformer softmax", "transformer softmax, guided alignment",
                 "lstm 2x2 dependent", "--reference-runs", "2",
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
    guided = json.loads((tmp_path / "records" / "transformer-softmax-guided-alignment-seed-1.json").read_text())
    assert guided["default_layer"] == 1 and guided["guided_heads"] == [0]  # Garg et al.'s penultimate layer, head 0
    assert [(row["layer"], row["heads"]) for row in guided["rows"]] == [(0, "mean"), (1, "mean"), (1, "all"),
                                                                        (2, "mean")]
    assert "| transformer softmax, guided alignment | 1 | 1 (default) | guided (0) |" in text
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
    assert record["trained_on"] == f"CPU, {os.cpu_count()} cores"  # the table names each seed's machine
    assert (tmp_path / "runs" / "seed-1-average2" / "averaged_from.json").is_file()
    for decoding in ("greedy", "beam5"):
        assert record[decoding]["gain"] == pytest.approx(record[decoding]["average"] - record[decoding]["last"])
        assert 0 < record[decoding]["p"] <= 1
    assert "## Checkpoint averaging" in (tmp_path / "RESULTS.md").read_text()


def test_translation_outputs_benchmark_end_to_end(tmp_path):
    model = train_tiny_model(toy_data(tmp_path / "data"), tmp_path / "model", "transformer")
    (tmp_path / "BENCHMARKS.md").write_text("# Benchmarks\n")
    script = load_example("benchmark_translation_outputs")
    report = script.main(["--model", str(model), "--toy", "6", "--lines", "9", "--rounds", "2", "--threads", "1",
                          "--output", str(tmp_path / "outputs.json"), "--markdown", str(tmp_path / "BENCHMARKS.md")])
    assert list(report["settings"]) == ["plain", "n-best 3", "alignments", "n-best 3 + alignments"]
    assert report["settings"]["plain"]["ratio_to_plain"] == 1 and report["lines"] == 9
    assert json.loads((tmp_path / "outputs.json").read_text())["settings"].keys() == report["settings"].keys()
    written = (tmp_path / "BENCHMARKS.md").read_text()
    assert "## n-best lists and alignments" in written and "| n-best 3 + alignments |" in written
    assert written.startswith("# Benchmarks\n")


@pytest.mark.slow
def test_decoding_benchmark_end_to_end(tmp_path):
    """The decoding benchmark's smoke run on a tiny model: every system's process translates the file, the table
    lands in its section of BENCHMARKS.md, and benchmark_speed's rewrite of the file keeps it."""
    data = toy_data(tmp_path / "data")
    script = load_example("benchmark_decoding")
    markdown = tmp_path / "BENCHMARKS.md"
    markdown.write_text("# Speed (CPU)\n")
    script.main([*data_flags(data), "--rounds", "1", "--sentences", "12", "--output-dir", str(tmp_path / "runs"),
                 "--work-dir", str(tmp_path / "work"), "--output", str(tmp_path / "decoding.json"),
                 "--markdown", str(markdown), "--variants", "transformer sparsemax",
                 "--transformer-flags", f"{TINY} --d_model 16 --ffn_dim 32"])
    report = json.loads((tmp_path / "decoding.json").read_text())
    assert set(report["rows"]) == {"1", "5"}
    systems = [row["system"] for row in report["rows"]["5"]]
    assert systems == ["anchor: MarianMTModel.generate", "ours, generate", "ours, fast", "ours, fast int8",
                       "ours, fast bfloat16", "ours, fast, early stopping", "ours, fast int8, early stopping",
                       "CTranslate2 float32", "CTranslate2 int8", "transformer sparsemax, fast",
                       "transformer sparsemax, fast int8"]
    beam = {row["system"]: row for row in report["rows"]["5"]}
    # CTranslate2's stopping rule gives CTranslate2's lines
    assert beam["ours, fast, early stopping"]["same_as_ctranslate2"] >= max(
        0.9, beam["ours, fast"]["same_as_ctranslate2"])
    assert beam["CTranslate2 float32"]["same_as_ctranslate2"] is None
    rows = {row["system"]: row for row in report["rows"]["1"]}
    assert rows["anchor: MarianMTModel.generate"]["same_as_anchor"] == 1.0 and rows["ours, fast"]["speedup"] > 0
    # the same weights: the fast path and CTranslate2's greedy search translate as the anchor does
    assert rows["ours, fast"]["same_as_anchor"] >= 0.9 and rows["CTranslate2 float32"]["same_as_anchor"] >= 0.9
    text = markdown.read_text()
    assert text.startswith("# Speed (CPU)\n\n<!-- section written by examples/benchmark_decoding.py -->")
    assert "| ours, fast int8 |" in text and "### Beam 5" in text
    sparsemax_row = next(line for line in text.splitlines() if line.startswith("| transformer sparsemax, fast |"))
    assert sparsemax_row.rstrip(" |").endswith(("(target <= 1.2x: met)", "(target <= 1.2x: not met)"))
    assert all(row["decoding"] == pytest.approx(row["median"] - row["startup"]) for row in report["rows"]["5"])
    # (the CTranslate2 marks need decoding times above zero, which 12 lines do not always give: see the unit test)
    assert "| start-up s | decoding s | sentences/s | speed-up | decoding / CTranslate2 |" in text
    # full batches: every line held to 5 tokens, in a section of its own
    script.main([*data_flags(data), "--rounds", "1", "--sentences", "12", "--output-dir", str(tmp_path / "runs"),
                 "--work-dir", str(tmp_path / "work-full"), "--output", str(tmp_path / "decoding-full.json"),
                 "--markdown", str(markdown), "--variants", "--full-length", "5", "--beams", "3", "--systems",
                 "anchor: MarianMTModel.generate", "ours, fast", "CTranslate2 float32",
                 "--transformer-flags", f"{TINY} --d_model 16 --ffn_dim 32"])
    full = json.loads((tmp_path / "decoding-full.json").read_text())
    assert full["full_length"] == 5 and [row["system"] for row in full["rows"]["3"]] == [
        "anchor: MarianMTModel.generate", "ours, fast", "CTranslate2 float32"]
    outputs = sorted((tmp_path / "work-full" / "outputs").glob("*.beam3.txt"))
    assert len(outputs) == 3 and all(len(output.read_text().splitlines()) == 12 for output in outputs)
    text = markdown.read_text()
    assert "## Decoding speed: every sentence held to 5 tokens (CPU)" in text
    assert "## Decoding speed: translating a file (CPU)" in text
    load_example("benchmark_speed").write_markdown(markdown, "# Speed (CPU)\n\nnew run\n")
    assert markdown.read_text().startswith("# Speed (CPU)\n\nnew run\n\n<!-- section written by")


def test_decoding_systems_on_a_gpu(tmp_path):
    """--device cuda: every process gets the device; float16 and bfloat16 rows instead of int8 (CPU only); no
    CTranslate2 rows without its exports, and CTranslate2's GPU compute types with them."""
    commands = load_example("benchmark_decoding").commands
    folders = {"marian": tmp_path / "marian", "softmax": tmp_path / "ours", "max_length": 128,
               "variants": {"transformer sparsemax": tmp_path / "sparsemax"}}
    systems = commands(folders, tmp_path / "input.de", tmp_path, 5, 2, "cuda")
    assert list(systems) == ["anchor: MarianMTModel.generate", "ours, generate", "ours, fast", "ours, fast float16",
                             "ours, fast bfloat16", "ours, fast, early stopping", "transformer sparsemax, fast",
                             "transformer sparsemax, fast float16"]
    for name, (argv, _) in systems.items():
        assert "cuda" in argv and "int8" not in argv, name
    folders.update({"ct2 float32": tmp_path / "ct2-float32", "ct2 int8": tmp_path / "ct2-int8"})
    ctranslate2 = {name: argv[-2] for name, (argv, _) in commands(folders, tmp_path / "input.de", tmp_path, 5, 2,
                                                                   "cuda").items() if name.startswith("CTranslate2")}
    assert ctranslate2 == {"CTranslate2 float32": "float32", "CTranslate2 float16": "float16",
                           "CTranslate2 int8_float16": "int8_float16"}


def test_full_batches_hold_every_systems_translations_to_the_length(tmp_path):
    """--full-length N reaches every process: min = max new tokens for ours and the anchor, min = max decoding
    length for CTranslate2; 0 (real lengths) adds nothing."""
    commands = load_example("benchmark_decoding").commands
    folders = {"marian": tmp_path / "marian", "softmax": tmp_path / "ours", "max_length": 128, "variants": {},
               "ct2 float32": tmp_path / "ct2-float32", "ct2 int8": tmp_path / "ct2-int8"}
    held = commands(folders, tmp_path / "input.de", tmp_path, 5, 2, "cpu", full_length=30)
    free = commands(folders, tmp_path / "input.de", tmp_path, 5, 2, "cpu")
    for name in ("ours, generate", "ours, fast", "ours, fast int8"):
        assert {"--min_new_tokens=30", "--max_new_tokens=30"} <= set(held[name][0]), name
        assert not any("new_tokens" in argument for argument in free[name][0]), name
    for name in ("anchor: MarianMTModel.generate", "CTranslate2 float32", "CTranslate2 int8"):
        assert held[name][0][-1] == "30" and free[name][0][-1] == "0", name
    # CTranslate2's stopping rule: beam search on real lengths only (held to a length, every hypothesis ends there)
    early = {name: argv for name, (argv, _) in free.items() if name.endswith(", early stopping")}
    assert list(early) == ["ours, fast, early stopping", "ours, fast int8, early stopping"]
    assert all(" ".join(argv).count("--early_stopping true") == 1 for argv in early.values())
    assert "--quantize" in early["ours, fast int8, early stopping"]
    assert not any(name.endswith(", early stopping") for name in held)
    assert not any(name.endswith(", early stopping") for name in commands(folders, tmp_path / "input.de", tmp_path, 1,
                                                                          2, "cpu"))


def test_decoding_rows_compare_each_variant_with_its_familys_softmax():
    relative = load_example("benchmark_decoding").relative_to_softmax
    medians = {"ours, fast": 10.0, "ours, fast int8": 8.0, "lstm baseline 1x1, fast": 4.0,
               "transformer sparsemax, fast": 16.0, "transformer mma, fast int8": 9.0,
               "lstm sparsemax, fast": 5.0, "lstm 2x2 dependent, fast": 4.8}
    assert relative("transformer sparsemax, fast", medians) == "1.60x (target <= 1.2x: not met)"
    assert relative("transformer mma, fast int8", medians) == "1.12x (target <= 1.2x: met)"
    assert relative("lstm sparsemax, fast", medians) == "1.25x (target <= 1.2x: not met)"
    assert relative("lstm 2x2 dependent, fast", medians) == "1.20x (target <= 1.2x: met)"
    assert relative("ours, fast", medians) == relative("lstm baseline 1x1, fast", medians) == ""


def test_decoding_rows_compare_decoding_time_with_ctranslate2_of_the_same_precision():
    relative = load_example("benchmark_decoding").relative_to_ctranslate2
    decodings = {"ours, fast": 9.0, "ours, fast int8": 6.0, "ours, generate": 12.0, "ours, fast bfloat16": 5.0,
                 "CTranslate2 float32": 6.0, "CTranslate2 int8": 6.0, "transformer mma, fast int8": 3.0,
                 "anchor: MarianMTModel.generate": None}
    assert relative("ours, fast", decodings) == "1.50x (target <= 1.0x: not met)"
    assert relative("ours, fast int8", decodings) == "1.00x (target <= 1.0x: met)"
    assert relative("ours, generate", decodings) == "2.00x" and relative("transformer mma, fast int8", decodings) == \
        "0.50x"
    decodings.update({"ours, fast, early stopping": 5.4, "ours, fast int8, early stopping": 7.2})
    assert relative("ours, fast, early stopping", decodings) == "0.90x (target <= 1.0x: met)"
    assert relative("ours, fast int8, early stopping", decodings) == "1.20x (target <= 1.0x: not met)"
    assert relative("ours, fast bfloat16", decodings) == relative("CTranslate2 int8", decodings) == ""
    assert relative("ours, fast bfloat16", decodings) == relative("CTranslate2 int8", decodings) == \
        relative("anchor: MarianMTModel.generate", decodings) == ""
