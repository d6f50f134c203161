"""benchmarks/quality/drop_and_length.py, the diagnostic behind RESULTS.md's note on DROP and output length: its
fit on records whose lengths and DROP are known by construction."""

import json

import pytest

from helpers import REPO, load_script


def load_diagnostic():
    return load_script(REPO / "benchmarks" / "quality" / "drop_and_length.py")


REFERENCE = ["one two three four five six seven eight nine ten"] * 10  # 100 tokens


SYSTEMS = {"a": "lstm malaviya2018 softmax", "b": "lstm malaviya2018 sparsemax",
           "c": "lstm malaviya2018 csparsemax predicted"}


def write_run(records, system: str, seed: int, words: int, drop: float) -> None:
    """A run of SYSTEMS[system] recorded as the quality benchmark records it, whose beam-5 output has `words` tokens
    against the reference's 100, with DROP `drop`."""
    name = SYSTEMS[system]
    folder = records / name.replace(" ", "-") / f"seed-{seed}"
    folder.mkdir(parents=True)
    lines = [" ".join(["one"] * (words // 10 + (row < words % 10))) for row in range(10)]
    (folder / "beam5.hyp.en").write_text("\n".join(lines) + "\n", encoding="utf-8")
    (folder / "result.json").write_text(json.dumps({"system": name, "seed": seed, "decoding": {
        "beam5": {"hypotheses": "beam5.hyp.en", "drop": drop, "rep": 1.0}}}))


def test_a_system_whose_drop_is_the_lines_at_its_length_gets_the_mean_drop(tmp_path):
    diagnostic = load_diagnostic()
    # DROP = 4 - 0.3 per 1% of length above 95%; system "b" 0.5 above that line at every length, at the mean length
    # of all runs (so that its offset moves the line's height, not its slope); "a" is short, "c" long
    lengths = {"a": (91, 93, 95), "b": (95, 97, 99), "c": (99, 101, 103)}
    for system, offset in (("a", 0.0), ("b", 0.5), ("c", 0.0)):
        for seed, words in enumerate(lengths[system], start=1):
            write_run(tmp_path, system, seed, words, 4 - 0.3 * (words - 95) + offset)
    found = diagnostic.runs(tmp_path, "malaviya2018", REFERENCE)

    assert [run["length"] for run in found if run["system"] == SYSTEMS["a"]] == pytest.approx([0.91, 0.93, 0.95])
    fit = diagnostic.length_fit(found)
    assert fit["slope"] == pytest.approx(-30.0)  # -0.3 per 1% of length
    assert fit["correlation"] < -0.9
    mean_drop = sum(run["drop"] for run in found) / len(found)
    systems = {key: fit["systems"][name] for key, name in SYSTEMS.items()}
    assert systems["a"]["drop_at_mean_length"] == pytest.approx(systems["c"]["drop_at_mean_length"])
    assert systems["b"]["drop_at_mean_length"] - systems["a"]["drop_at_mean_length"] == pytest.approx(0.5)
    assert systems["a"]["drop"] - systems["c"]["drop"] == pytest.approx(2.4)  # a is shorter: more DROP, all of it length
    assert (systems["a"]["drop_at_mean_length"] + systems["b"]["drop_at_mean_length"]
            + systems["c"]["drop_at_mean_length"]) / 3 == pytest.approx(mean_drop)


def test_a_hypothesis_file_of_another_length_is_refused_naming_it(tmp_path):
    write_run(tmp_path, "a", 1, 90, 4.0)
    with pytest.raises(ValueError, match=r"seed-1/beam5.hyp.en: 10 lines, the reference has 11"):
        load_diagnostic().runs(tmp_path, "malaviya2018", REFERENCE + ["eleven"])
