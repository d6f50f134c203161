"""One progress rule for every command (issue 75): a bar where standard error is a terminal, plain whole lines with
the rate and the time left where it is not, Trainer's bars included; --quiet shows none."""

import io
import os
import re
import subprocess
import sys

from hf_headattn.progress import Progress, rate_text

from helpers import file_flags, toy_data

ESCAPES = re.compile(r"\r|\x1b\[")


class Terminal(io.StringIO):
    def isatty(self):
        return True


def test_plain_lines_where_the_stream_is_no_terminal():
    stream = io.StringIO()
    with Progress(total=40, desc="translating test.de", unit="sentence", file=stream, mininterval=0) as bar:
        for step in range(40):
            bar.update(1)
            if step == 10:
                bar.write("a log line", file=stream)
    lines = stream.getvalue().splitlines()
    assert not ESCAPES.search(stream.getvalue())
    assert "a log line" in lines
    progress = [line for line in lines if line != "a log line"]
    assert progress[-1].startswith("translating test.de: 40/40 sentences (100%) | ")
    assert all(re.fullmatch(r"translating test\.de: \d+/40 sentences \(\d+%\) \| [\d.?]+ ?\w*sentences?/s \| "
                            r"elapsed \d\d:\d\d \| ETA [\d:?]+", line) for line in progress), progress
    assert len(progress) == len(set(progress)) == 40  # one line a count, no line twice (no redraw after the log)


def test_a_rate_below_one_a_second_reads_as_seconds_each():
    assert rate_text(21.834, "steps") == "21.83 steps/s" and rate_text(0.2364, "steps") == "4.23 s/step"
    assert rate_text(0.5, "batches") == "2.00 s/batch" and rate_text(0.5, "sentences") == "2.00 s/sentence"
    assert rate_text(0.25, "") == "4.00 s/it" and rate_text(None, "steps") == "? steps/s"


def test_plain_lines_are_spaced_by_the_interval_and_the_last_count_is_said_once():
    stream = io.StringIO()
    with Progress(total=1000, desc="reading", file=stream) as bar:  # the default interval: 30 s
        for _ in range(1000):
            bar.update(1)
    assert stream.getvalue().splitlines() == [line for line in stream.getvalue().splitlines()
                                              if line.startswith("reading: 1000/1000 (100%)")]


def test_a_bar_on_a_terminal():
    stream = Terminal()
    with Progress(total=3, desc="translating", file=stream, mininterval=0) as bar:
        bar.update(3)
    assert "\r" in stream.getvalue() and "100%|" in stream.getvalue()


def test_trainers_bars_in_a_log_are_plain_lines(tmp_path):
    """The training command with its standard error in a file: the tokenizer's, the tokenisation's, the steps' and
    the validation's progress as plain lines, no cursor escapes (`[A`, as tqdm's nested bars wrote them)."""
    data = toy_data(tmp_path / "data")
    argv = [*file_flags(data), "--vocab_size", "150", "--d_model", "32", "--layers", "1", "--heads", "2",
            "--ffn_dim", "64", "--max_length", "24", "--max_steps", "4", "--eval_strategy", "steps", "--eval_steps",
            "2", "--logging_steps", "2", "--per_device_eval_batch_size", "4", "--output_dir", str(tmp_path / "run")]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_CACHE": str(tmp_path / "datasets")}
    done = subprocess.run([sys.executable, "-m", "hf_headattn.commands.train", *argv], env=env, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert not ESCAPES.search(done.stderr), done.stderr[-3000:]
    lines = done.stderr.splitlines()
    assert any(line.startswith("training: 4/4 steps (100%) | ") for line in lines), done.stderr[-3000:]
    assert any(line.startswith("validation: ") and "batches (100%)" in line for line in lines), done.stderr[-3000:]
    assert any(line.startswith("training the tokenizer: ") for line in lines), done.stderr[-3000:]


def test_quiet_training_shows_only_warnings_and_errors(tmp_path):
    """`hf-headattn-train --quiet`, as the other commands' --quiet: no bar (the forked data preparation's included),
    no training logs, no result line; the model is written. With --verbose beside it, a usage error."""
    data = toy_data(tmp_path / "data")
    argv = [*file_flags(data), "--vocab_size", "150", "--d_model", "32", "--layers", "1", "--heads", "2",
            "--ffn_dim", "64", "--max_length", "24", "--max_steps", "2", "--eval_strategy", "steps", "--eval_steps",
            "2", "--logging_steps", "1", "--output_dir", str(tmp_path / "run"), "--quiet"]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_CACHE": str(tmp_path / "datasets")}
    done = subprocess.run([sys.executable, "-m", "hf_headattn.commands.train", *argv], env=env, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    shown = [line for line in (done.stdout + done.stderr).splitlines() if line.strip()]
    assert not [line for line in shown if "warn" not in line.lower()], shown
    assert (tmp_path / "run" / "config.json").is_file()
    refused = subprocess.run([sys.executable, "-m", "hf_headattn.commands.train", *argv, "--verbose"], env=env,
                             capture_output=True, text=True, timeout=600)
    assert refused.returncode == 2 and "--quiet" in refused.stderr and "--verbose" in refused.stderr, refused.stderr


def test_quiet_training_in_process_leaves_the_callers_bars_on(tmp_path, monkeypatch):
    """`--quiet` silences every bar through TQDM_DISABLE while it trains, and gives the caller's process its
    environment back: a notebook's later bars still show."""
    from hf_headattn.commands.train import main

    monkeypatch.delenv("TQDM_DISABLE", raising=False)
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "datasets"))
    data = toy_data(tmp_path / "data")
    main([*file_flags(data), "--vocab_size", "150", "--d_model", "32", "--layers", "1", "--heads", "2", "--ffn_dim",
          "64", "--max_length", "24", "--max_steps", "1", "--output_dir", str(tmp_path / "run"), "--quiet"])
    assert (tmp_path / "run" / "config.json").is_file() and "TQDM_DISABLE" not in os.environ
