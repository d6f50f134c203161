"""examples/benchmark_speed.py: the target checks and the Markdown report on made-up throughputs, and (slow) the
--quick smoke run on Multi30k."""

import json
import os
import sys
from pathlib import Path

import pytest

from helpers import MULTI30K, load_example


def measured(train, beam5, greedy=10.0):
    """One model's throughputs over two rounds, as the benchmark stores them."""
    def summary(values):
        return {"median": sorted(values)[len(values) // 2], "min": min(values), "max": max(values), "all": values}
    return {"train_tokens_per_s": summary(train), "greedy_sentences_per_s": summary([greedy, greedy]),
            "beam5_sentences_per_s": summary(beam5), "parameters": 1000, "peak_memory_mib": 12.0}


def test_targets_compare_time_ratios_with_the_limits():
    script = load_example("benchmark_speed")
    shapes = {"256x3": {
        "marian": measured(train=[100.0, 100.0], beam5=[10.0, 10.0]),
        "softmax": measured(train=[110.0, 90.0], beam5=[8.0, 8.0]),  # median 110 tok/s: time ratio 100/110
        "csparsemax": measured(train=[50.0, 50.0], beam5=[5.0, 5.0]),
    }}
    checks = {(c["model"], c["anchor"], c["measure"]): c for c in script.check_targets(shapes, script.TARGETS)}
    softmax_train = checks["softmax", "marian", "train"]
    assert softmax_train["ratio"] == pytest.approx(100 / 110) and softmax_train["met"]
    assert softmax_train["round_ratios"] == pytest.approx([100 / 110, 100 / 90])
    assert not checks["softmax", "marian", "beam5"]["met"]  # 10/8 = 1.25 > 1.00
    assert checks["csparsemax", "softmax", "train"]["ratio"] == pytest.approx(110 / 50)  # 2.2 > 2.0
    assert not checks["csparsemax", "softmax", "train"]["met"]
    assert checks["csparsemax", "softmax", "beam5"]["ratio"] == pytest.approx(8 / 5)  # 1.6 > 1.5
    assert ("mma", "softmax", "train") not in checks  # not measured: not claimed

    report = {
        "machine": {"platform": "Linux", "processor": "CPU X", "cpus": 2, "threads": 2, "device": "cpu",
                    "torch": "2.x", "cuda": None},
        "settings": {"repeats": 2, "sentences": 16, "output_length": 20},
        "command": "python examples/benchmark_speed.py --repeats 2",
        "batches": [{"sentences": 100, "target_tokens": 2000}],
        "shapes": shapes, "targets": list(checks.values()), "minutes": 3.5,
    }
    text = script.markdown_report(report)
    assert "python examples/benchmark_speed.py --repeats 2" in text
    assert "1 of 4 target checks met" in text
    assert "| softmax train <= 1.00x marian | 256x3 | 0.91 | 0.91-1.11 | yes |" in text
    assert "| csparsemax train <= 2.00x softmax | 256x3 | 2.20 | 1.80-2.20 | NO |" in text
    assert "| softmax | 1,000 | 12 | 110.0 [90.0-110.0] | 0.91 | 1.00 |" in text


@pytest.mark.slow
@pytest.mark.skipif(not MULTI30K.is_dir(), reason="needs ../shared/data/multi30k")
def test_quick_run_writes_json_and_markdown(tmp_path):
    script = load_example("benchmark_speed")
    script.main(["--quick", "--data-dir", str(MULTI30K), "--models", "marian", "softmax", "csparsemax",
                 "--cache-dir", str(tmp_path / "cache"), "--output", str(tmp_path / "speed.json"),
                 "--markdown", str(tmp_path / "BENCHMARKS.md"), "--threads", "1"])
    report = json.loads((tmp_path / "speed.json").read_text())
    result = report["shapes"]["256x1"]
    assert set(result) == {"marian", "softmax", "csparsemax"}
    assert all(result[name]["train_tokens_per_s"]["median"] > 0 for name in result)
    assert {r["transform"] for r in report["kernels"]["runs"][0]["results"]} == {
        "sparsemax", "csoftmax", "csparsemax", "csparsemax compiled"}
    text = (tmp_path / "BENCHMARKS.md").read_text()
    assert "## Targets" in text and "## Sparse kernels" in text


def test_data_prep_report_marks_the_targets(tmp_path):
    script = load_example("benchmark_data_prep")
    source, target = script.corpus(MULTI30K if MULTI30K.is_dir() else _toy_multi30k(tmp_path), 50, tmp_path)
    assert len(source.read_text(encoding="utf-8").splitlines()) == 50 == len(target.read_text().splitlines())

    def run(seconds, peak):
        return {"seconds": seconds, "seconds_to_exit": seconds + 2, "peak_mib": peak, "peak_anonymous_mib": peak / 2,
                "command": "x"}
    report = {"machine": {"cpu_model": "CPU X", "processor": "x86_64", "cpu_count": 2, "torch": "2.x",
                          "transformers": "5.x"}, "command": "python examples/benchmark_data_prep.py",
              "sizes": [{"pairs": 29_000, "by hand": run(10.0, 300), "command": run(11.0, 400), "time_ratio": 1.1,
                         "memory_ratio": 4 / 3},
                        {"pairs": 2_900_000, "by hand": run(300.0, 900), "command": run(400.0, 1100),
                         "time_ratio": 4 / 3, "memory_ratio": 11 / 9}]}
    text = script.section_text(report)
    assert "| 29,000 | 10.0 | 300 (150) | 11.0 | 13.0 | 400 (200) | 1.10 | 1.33 | time <= 1.2x: met |" in text
    assert "| 2,900,000 | 300.0 | 900 (450) | 400.0 | 402.0 | 1100 (550) | 1.33 | 1.22 | time <= 1.2x: not met; " \
           "peak < 1 GB: not met |" in text


def test_data_prep_publishes_one_table_a_cpu_vendor():
    script = load_example("benchmark_data_prep")
    assert script.cpu_vendor("AMD EPYC") == "amd" and script.cpu_vendor("Intel(R) Xeon(R) Processor") == "intel"
    assert script.cpu_vendor("Neoverse-V2") == script.cpu_vendor(None) == "other"
    quality = load_example("benchmark_quality")
    assert {f"data_prep-{vendor}" for vendor in (*script.CPU_VENDORS, "other")} <= set(quality.OTHER_SECTIONS)
    published = Path(__file__).parents[1] / "BENCHMARKS.md"
    for vendor in script.CPU_VENDORS:
        assert quality.section_markers(f"data_prep-{vendor}")[0] in published.read_text(encoding="utf-8")


def test_data_prep_rounds_give_medians_ranges_and_the_largest_peaks():
    script = load_example("benchmark_data_prep")
    assert script.rounds_at(29_000, 5) == 5 and script.rounds_at(2_900_000, 5) == 1
    measures = [{"seconds": seconds, "seconds_to_exit": seconds + 2, "peak_mib": peak, "peak_anonymous_mib": peak - 100,
                 "command": "x"} for seconds, peak in ((4.2, 500), (3.8, 700), (4.0, 600))]
    summary = script.summarise(measures)
    assert (summary["seconds"], summary["seconds_min"], summary["seconds_max"]) == (4.0, 3.8, 4.2)
    assert summary["seconds_to_exit"] == 6.0 and summary["peak_mib"] == 700 and summary["peak_anonymous_mib"] == 600
    assert script._seconds(summary) == "4.0 [3.8-4.2]" and script._seconds(script.summarise(measures[:1])) == "4.2"


def test_data_prep_times_a_process_to_its_first_logged_step(tmp_path):
    """The command's time is taken when its output first shows a logged loss, even where the line is split between
    two reads, and a process that never shows one is an error naming its log."""
    script = load_example("benchmark_data_prep")
    printer = ("import sys, time; sys.stdout.write('prep\\r 0/1\\rlo'); sys.stdout.flush(); time.sleep(0.3); "
               "print('ss 9.25 | grad_norm 1'); sys.stdout.flush(); time.sleep(0.6)")
    result = script.measure([sys.executable, "-c", printer], dict(os.environ), 0.05, tmp_path / "log",
                            until=script.FIRST_STEP_LOGGED)
    assert 0.3 <= result["seconds"] < result["seconds_to_exit"] and result["seconds_to_exit"] >= 0.9
    assert "loss 9.25 | grad_norm 1" in (tmp_path / "log").read_text()
    silent = [sys.executable, "-c", "print('eval_loss 3.2 | epoch 1')"]  # an evaluation's loss is not the step's
    with pytest.raises(RuntimeError, match="never wrote a line matching .*log"):
        script.measure(silent, dict(os.environ), 0.05, tmp_path / "silent.log", until=script.FIRST_STEP_LOGGED)


def _toy_multi30k(directory):
    for language in ("de", "en"):
        (directory / f"train.{language}").write_text("".join(f"{language} {i}\n" for i in range(7)), encoding="utf-8")
    return directory


def _compiled_step_report(eager_ms, compiled_ms, break_even):
    return {"machine": {"cpu_model": "CPU X", "cpu_count": 2, "torch": "2.x", "transformers": "5.x"},
            "sentences": 128, "num_beams": 5, "rows": 640, "steps": 20, "threads": 2, "rounds": [{}, {}, {}],
            "compile_s": 60.0, "warm_compile_s": 20.0, "eager_step_ms": eager_ms, "compiled_step_ms": compiled_ms,
            "ratio": compiled_ms / eager_ms, "break_even_steps": break_even, "same_tokens": True,
            "command": "python examples/benchmark_compiled_step.py"}


def test_compiled_step_report_gives_the_break_even_or_never():
    script = load_example("benchmark_compiled_step")
    text = script.section_text(_compiled_step_report(80.0, 75.0, 4000.0))
    assert "| 60.0 | 20.0 | 80.0 | 75.0 | 0.94 | 4,000 steps | yes |" in text
    assert "128 sentences x 5 beams = 640 rows" in text
    slower = script.section_text(_compiled_step_report(80.0, 90.0, None))
    assert "| 1.12 | never (the compiled step is not faster) |" in slower


def test_compiled_step_benchmark_steps_the_cached_decoder_as_a_full_forward_would():
    """The benchmark's step loop (one token a row, the cache carried) chooses the tokens that re-reading the whole
    prefix without a cache chooses: it times the fast path's step, not some other computation."""
    import torch

    from helpers.models import random_model, source_batch, tiny_config

    script = load_example("benchmark_compiled_step")
    model = random_model(tiny_config())
    input_ids, attention_mask = source_batch()
    with torch.inference_mode():
        encoder_outputs = model.get_encoder()(input_ids=input_ids, attention_mask=attention_mask, return_dict=True)
        rows = {"encoder_outputs": encoder_outputs, "attention_mask": attention_mask}
        seconds, tokens = script.decode_steps(model, model, rows, steps=4)
        prefix = torch.full((3, 1), model.config.decoder_start_token_id)
        for _ in range(4):
            logits = model(**rows, decoder_input_ids=prefix, use_cache=False).logits
            prefix = torch.cat([prefix, logits[:, -1].argmax(dim=-1, keepdim=True)], dim=1)
    assert len(seconds) == 4 and all(second > 0 for second in seconds)
    assert torch.equal(tokens, prefix[:, 1:])


def tiny_model_beside_its_test_source(tmp_path, test_source: str):
    """A tiny trained Transformer's folder, with the toy test sources written to tmp_path / `test_source` (the
    benchmarks' --data-dir is then tmp_path)."""
    from helpers.runs import toy_data, train_tiny_model

    data = toy_data(tmp_path / "data")
    (tmp_path / test_source).write_text(data["test.src"].read_text(encoding="utf-8"), encoding="utf-8")
    return train_tiny_model(data, tmp_path / "model", "transformer")


@pytest.mark.slow
def test_compiled_step_benchmark_runs_on_a_tiny_model(tmp_path):
    """The whole script on a tiny trained model: it compiles, times both steps, finds the same tokens and writes its
    JSON and its BENCHMARKS.md section."""
    script = load_example("benchmark_compiled_step")
    model_dir = tiny_model_beside_its_test_source(tmp_path, script.TEST_SOURCE)
    script.main(["--model", str(model_dir), "--data-dir", str(tmp_path), "--sentences", "4", "--num-beams", "2",
                 "--steps", "3", "--rounds", "1", "--threads", "1", "--output", str(tmp_path / "compiled.json"),
                 "--markdown", str(tmp_path / "BENCHMARKS.md")])
    report = json.loads((tmp_path / "compiled.json").read_text())
    assert report["rows"] == 8 and report["same_tokens"]
    assert report["compile_s"] > 0 and report["warm_compile_s"] > 0 and report["eager_step_ms"] > 0
    assert "## Compiled decoding step (CPU)" in (tmp_path / "BENCHMARKS.md").read_text()


def test_decoding_profile_runs_on_a_tiny_model(tmp_path):
    """The whole script on a tiny trained model: both searches give the same lines, each step reads a value on the
    host at least once (generate's stopping check; the fast path's count of done sentences), the CPU has no kernel
    launches, and the JSON and the BENCHMARKS.md section are written."""
    script = load_example("benchmark_decoding_profile")
    model_dir = tiny_model_beside_its_test_source(tmp_path, script.TEST_SOURCE)
    script.main(["--model", str(model_dir), "--data-dir", str(tmp_path), "--device", "cpu", "--sentences", "6",
                 "--num-beams", "2", "--rounds", "1", "--threads", "1", "--output", str(tmp_path / "profile.json"),
                 "--markdown", str(tmp_path / "BENCHMARKS.md")])
    report = json.loads((tmp_path / "profile.json").read_text())
    assert report["same_lines"] and report["sentences"] == 6 and set(report["systems"]) == {"generate", "fast path"}
    for system in report["systems"].values():
        assert system["steps"] > 0 and system["wall_ms"] > 0 and system["operators_ms"] > 0
        assert system["operator_calls"] > system["steps"] and system["host_reads"] >= system["steps"]
        assert system["kernel_launches"] == 0 and system["device_waits"] == 0 and system["top_operators"]
    section = (tmp_path / "BENCHMARKS.md").read_text()
    assert "## Decoding profile: one batch, fast path against generate (CPU)" in section
    assert "<!-- end of section decoding_profile -->" in section

def _fast_path_report():
    def model(greedy, beam5, beam5_differing=0):
        return {"seconds": {"greedy": greedy, "beam5": beam5},
                "same_as_generate": {"greedy": {"differing": 0, "score_difference": None},
                                     "beam5": {"differing": beam5_differing, "score_difference": 4.1e-5}}}
    return {"machine": {"cpu_model": "CPU X", "cpu_count": 2, "torch": "2.x", "transformers": "5.x"}, "threads": 2,
            "sentences": 128, "output_length": 30, "rounds": 3, "minutes": 4.2,
            "families": {"transformer": {"softmax": model([1.0, 2.0, 1.1], [4.0, 4.0, 5.0]),
                                         "csparsemax predicted": model([1.3, 1.2, 1.4], [4.0, 4.4, 4.8])},
                         "lstm": {"softmax": model([2.0, 2.0, 2.0], [5.0, 5.0, 5.0]),
                                  "sparsemax": model([2.2, 2.2, 2.2], [7.0, 6.0, 8.0], beam5_differing=1)}},
            "command": "python examples/benchmark_fast_path.py"}


def test_fast_path_report_compares_each_variant_with_its_familys_softmax():
    """Each variant's time over its own family's softmax model's (not the other family's) in the same round, the
    median over the rounds against 1.2x, and which decodings differ from generate's."""
    script = load_example("benchmark_fast_path")
    report = _fast_path_report()
    checks = {(family, name, mode): (round(ratio, 3), met) for family, name, mode, ratio, met in
              script.targets(report)}
    # per round: greedy 1.3/1.0, 1.2/2.0, 1.4/1.1 -> median 1.4/1.1 (the medians' ratio would be 1.3/1.1, met);
    # beam 4.0/4.0, 4.4/4.0, 4.8/5.0 -> median 1.0 (the medians' ratio 1.1)
    assert checks == {("transformer", "csparsemax predicted", "greedy"): (round(1.4 / 1.1, 3), False),
                      ("transformer", "csparsemax predicted", "beam5"): (1.0, True),
                      ("lstm", "sparsemax", "greedy"): (1.1, True),
                      ("lstm", "sparsemax", "beam5"): (1.4, False)}
    text = script.section_text(report)
    assert "2 of 4 target checks met." in text
    assert "| csparsemax predicted | 1.30 [1.20-1.40] | 1.27 [0.60-1.30] (not met) | 4.40 [4.00-4.80] | " \
           "1.00 [0.96-1.10] (met) | yes |" in text
    assert "| sparsemax | 2.20 [2.20-2.20] | 1.10 [1.10-1.10] (met) | 7.00 [6.00-8.00] | 1.40 [1.20-1.60] (not met) " \
           "| greedy: yes, beam5: 1 of 128 differ (scores within 4e-05) |" in text
    assert text.index("### Transformer") < text.index("### LSTM")


@pytest.mark.slow
def test_fast_path_benchmark_quick_run(tmp_path):
    """The --quick run on Multi30k: every model of both families decodes, its ids are generate's, and the JSON and
    the BENCHMARKS.md section are written."""
    script = load_example("benchmark_fast_path")
    script.main(["--quick", "--threads", "1", "--data-dir", str(MULTI30K), "--cache-dir", str(tmp_path / "cache"),
                 "--output", str(tmp_path / "fast_path.json"), "--markdown", str(tmp_path / "BENCHMARKS.md")])
    report = json.loads((tmp_path / "fast_path.json").read_text())
    assert set(report["families"]["transformer"]) == set(script.TRANSFORMER_MODELS)
    assert set(report["families"]["lstm"]) == set(script.LSTM_MODELS)
    assert all(not same["differing"] for family in report["families"].values() for model in family.values()
               for same in model["same_as_generate"].values())
    assert "## Fast path: every variant against its family's softmax (CPU)" in (tmp_path / "BENCHMARKS.md").read_text()
