"""examples/benchmark_backends.py: the systems it runs, the time ratios and target checks and the Markdown section on
made-up throughputs, and (slow) the --quick smoke run writing its JSON and its section of BENCHMARKS.md."""

import json

import pytest
import torch

from hf_headattn.runtime.attention_backends import cpu_flex_problem

from helpers import load_example


def summary(median):
    return {"median": median, "min": median * 0.9, "max": median * 1.1, "all": [median]}


def made_up_results():
    return {
        "softmax eager": {"train": summary(90.0), "forward": summary(400.0), "warm_up_seconds": 0.1,
                          "host_sync_free_forward": None},
        "softmax sdpa": {"train": summary(100.0), "forward": summary(500.0), "warm_up_seconds": 0.1,
                         "host_sync_free_forward": None},
        "mma flex_attention": {"train": {"not_run": "no CPU backward (PyTorch 2.13 flex attention)"},
                               "forward": summary(400.0), "warm_up_seconds": 12.0, "host_sync_free_forward": None},
    }


def test_systems_batches_and_what_cannot_train():
    script = load_example("benchmark_backends")
    systems = script.systems_for(["softmax", "mma"], ["eager", "sdpa", "flex_attention", "flash_attention_2"])
    assert ("softmax", "flash_attention_2") in systems and ("mma", "flash_attention_2") not in systems  # per-head masks
    assert len(systems) == 7
    cpu = torch.device("cpu")
    assert script.cannot_run("flex_attention", cpu, "train") and script.cannot_run("sdpa", cpu, "train") is None
    assert (script.cannot_run("flex_attention", cpu, "forward") is None) == (cpu_flex_problem() is None)
    batches = script.make_batches(2, 4, 100, 5, 9, seed=0)
    assert len(batches) == 2
    for batch in batches:
        assert batch["input_ids"].shape[0] == 4 and 5 <= batch["input_ids"].shape[1] <= 9
        assert torch.equal(batch["attention_mask"], (batch["input_ids"] != 0).long())
        lengths = (batch["labels"] != -100).sum(-1)
        assert ((lengths >= 5) & (lengths <= 9)).all()
        assert (batch["labels"].gather(1, lengths[:, None] - 1) == 1).all()  # every target ends in EOS


def test_ratios_targets_and_section():
    script = load_example("benchmark_backends")
    results = made_up_results()
    assert script.time_ratio(results, "softmax eager", "train") == pytest.approx(100 / 90)
    assert script.time_ratio(results, "mma flex_attention", "train") is None
    checks = script.check_targets(results, ["train", "forward"], "cpu")
    assert checks == [{"system": "mma flex_attention", "measure": "forward", "limit": 1.2,
                       "ratio": pytest.approx(500 / 400), "met": False}]  # 1.25 > 1.2
    assert script.check_targets(results, ["forward"], "cuda") == []  # the target is the CPU's
    report = {
        "command": "python examples/benchmark_backends.py --repeats 3",
        "machine": {"device": "cpu", "processor": "CPU X", "threads": 2, "torch": "2.x", "transformers": "5.x"},
        "settings": {"d_model": 256, "layers": 3, "batches": 4, "batch_size": 32, "min_length": 8, "max_length": 28,
                     "output_length": 20, "repeats": 3, "measures": ["train", "forward"]},
        "results": results, "targets": checks, "minutes": 2.0,
        "host_sync_free_forward_by_variant": {"softmax": True, "csparsemax": False},
    }
    text = script.section_text(report)
    assert "`python examples/benchmark_backends.py --repeats 3`" in text
    assert "| softmax eager | 90.0 [81.0-99.0] | 1.11 | 400.0 [360.0-440.0] | 1.25 | 0.1 | n/a (CPU) |" in text
    assert "| mma flex_attention | n/a: no CPU backward (PyTorch 2.13 flex attention) |  | 400.0" in text
    assert "Targets (issue 31): 0 of 1 met." in text
    assert "| mma flex_attention <= 1.2x sdpa softmax | forward | 1.25 | NO |" in text
    assert "Forward without host synchronisation (sdpa, inputs checked beforehand): softmax yes, csparsemax NO." in text


def test_the_host_synchronisation_check_covers_every_variant_and_needs_cuda():
    script = load_example("benchmark_backends")
    for placement in script.sync_variants(4).values():  # each placement builds
        script.build_model(placement, "sdpa", 256, 1, 100, torch.device("cpu"))
    assert script.host_sync_by_variant(None, None, torch.device("cpu")) is None


def test_a_gpu_run_is_published_beside_the_cpu_report(tmp_path, monkeypatch):
    # Without --output, a CUDA run writes its own JSON and section: the CPU's stay as they are.
    script = load_example("benchmark_backends")
    monkeypatch.chdir(tmp_path)
    (tmp_path / "benchmarks").mkdir()
    cpu_json = tmp_path / "benchmarks" / "backends.json"
    cpu_json.write_text(json.dumps({"results": {"softmax sdpa": {}}}))
    cpu_section = ("<!-- section written by examples/benchmark_backends.py -->\nthe CPU table\n"
                   "<!-- end of section backends -->")
    (tmp_path / "BENCHMARKS.md").write_text(f"# Benchmarks\n\n{cpu_section}\n")
    monkeypatch.setattr(script, "run", lambda args: ({"softmax sdpa": made_up_results()["softmax sdpa"]}, None))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *args: "GPU X")
    script.main(["--device", "cuda", "--measures", "train", "forward"])
    assert json.loads(cpu_json.read_text()) == {"results": {"softmax sdpa": {}}}
    assert json.loads((tmp_path / "benchmarks" / "backends-gpu.json").read_text())["machine"]["processor"] == "GPU X"
    text = (tmp_path / "BENCHMARKS.md").read_text()
    assert cpu_section in text
    assert "<!-- section written by examples/benchmark_backends.py (gpu) -->\n## Attention backends (cuda)" in text


@pytest.mark.slow
def test_quick_run_writes_json_and_its_section(tmp_path):
    script = load_example("benchmark_backends")
    markdown = tmp_path / "BENCHMARKS.md"
    markdown.write_text("# Speed (CPU)\n\nthe speed benchmark's report\n")
    report = script.main(["--quick", "--device", "cpu", "--threads", "1", "--output", str(tmp_path / "backends.json"),
                          "--markdown", str(markdown)])
    saved = json.loads((tmp_path / "backends.json").read_text())
    assert saved["results"].keys() == report["results"].keys() == {
        f"{variant} {backend}" for variant in ("softmax", "mma") for backend in ("eager", "sdpa", "flex_attention")}
    for system, entry in saved["results"].items():
        for measure in ("forward", "greedy", "beam5"):
            assert "not_run" in entry[measure] or entry[measure]["median"] > 0, (system, measure)
        assert ("not_run" in entry["train"]) == system.endswith("flex_attention")
        # where this CPU's compiled flex kernel is wrong, flex attention is refused, and its rows say so
        assert ("not_run" in entry["forward"]) == (system.endswith("flex_attention") and cpu_flex_problem() is not None)
    text = markdown.read_text()
    assert text.startswith("# Speed (CPU)\n\nthe speed benchmark's report")
    assert "<!-- section written by examples/benchmark_backends.py -->" in text and "| mma flex_attention |" in text
