"""Everything the tooling writes is a transaction (issue 44): `output_files` on its own, with real SIGKILLs for the
leftovers of interrupted writes, and the commands' refusals that rest on it."""

import json
import os
import subprocess
import sys
import textwrap

import pytest

from hf_headattn import output_files
from hf_headattn.commands import train as train_command
from hf_headattn.output_files import (OUTPUT_RECORD, OutputExists, OutputRefused, check_output_folder, new_file,
                                      new_folder, write_record, written_by)

from helpers import REPO, toy_data


def default_mode(directory: bool = False) -> int:
    umask = os.umask(0)
    os.umask(umask)
    return (0o777 if directory else 0o666) & ~umask


def killed_while_writing(code: str) -> None:
    """Run `code` (with output_files imported) in a fresh interpreter that SIGKILLs itself where it says `die()`."""
    script = textwrap.dedent("""
        import os, signal
        from hf_headattn import output_files
        def die():
            os.kill(os.getpid(), signal.SIGKILL)
    """) + textwrap.dedent(code)
    finished = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True)
    assert finished.returncode == -9, finished.stderr


def test_a_folder_appears_whole_recorded_and_readable(tmp_path):
    from safetensors.torch import save_file
    import torch

    with new_folder(tmp_path / "out", command="hf-headattn-test") as staging:
        save_file({"w": torch.zeros(2)}, staging / "model.safetensors")  # safetensors writes 0600
        (staging / "sub").mkdir()
        (staging / "sub" / "notes.txt").write_text("x")
        assert not (tmp_path / "out").exists()
    assert written_by(tmp_path / "out") == "hf-headattn-test"
    assert (tmp_path / "out" / "model.safetensors").stat().st_mode & 0o777 == default_mode()
    assert (tmp_path / "out" / "sub").stat().st_mode & 0o777 == default_mode(directory=True)
    assert sorted(path.name for path in tmp_path.iterdir()) == ["out"]
    with pytest.raises(RuntimeError), new_folder(tmp_path / "out", command="hf-headattn-test", overwrite=True) as staging:
        (staging / "half").write_text("x")
        raise RuntimeError("interrupted")
    assert (tmp_path / "out" / "model.safetensors").is_file() and not (tmp_path / "out" / "half").exists()
    assert sorted(path.name for path in tmp_path.iterdir()) == ["out"]


def test_overwrite_replaces_only_what_the_same_command_wrote(tmp_path):
    model = tmp_path / "runs" / "model"
    model.mkdir(parents=True)
    (model / "config.json").write_text("{}")
    cases = {  # output -> the refusal's words
        model: "is the input",
        model.parent: "holds the input",
        model / "export": "lies inside the input",
    }
    for output, words in cases.items():
        with pytest.raises(OutputRefused, match=words):
            check_output_folder(output, command="hf-headattn-export", overwrite=True, inputs=[model])
    (tmp_path / "file").write_text("x")
    with pytest.raises(OutputRefused, match="is a file, not a folder"):
        check_output_folder(tmp_path / "file", command="hf-headattn-export", overwrite=True)
    with pytest.raises(OutputExists, match="exists; choose another folder or pass --overwrite") as exists:
        check_output_folder(model.parent, command="hf-headattn-export", overwrite=False)
    assert isinstance(exists.value, FileExistsError) and isinstance(exists.value, ValueError)
    users = tmp_path / "users"
    users.mkdir()
    (users / "notes.txt").write_text("x")
    with pytest.raises(OutputRefused, match=f"has no {OUTPUT_RECORD} saying which command wrote it"):
        check_output_folder(users, command="hf-headattn-export", overwrite=True)
    write_record(users, "hf-headattn-train")
    with pytest.raises(OutputRefused, match="holds a training run"):
        check_output_folder(users, command="hf-headattn-export", overwrite=True)
    write_record(users, "hf-headattn-average")
    with pytest.raises(OutputRefused, match="was written by hf-headattn-average"):
        check_output_folder(users, command="hf-headattn-export", overwrite=True)
    (users / OUTPUT_RECORD).write_text("{not json")
    assert written_by(users) is None
    write_record(users, "hf-headattn-export")
    check_output_folder(users, command="hf-headattn-export", overwrite=True)
    (tmp_path / "empty").mkdir()
    check_output_folder(tmp_path / "empty", command="hf-headattn-export", overwrite=True)


def test_a_killed_writers_staging_folder_is_removed_at_the_next_start_and_a_live_one_is_not(tmp_path):
    output = tmp_path / "avg"
    killed_while_writing(f"""
        with output_files.new_folder({str(output)!r}, command="hf-headattn-average") as staging:
            (staging / "model.safetensors").write_bytes(bytes(1000))
            die()
    """)
    leftovers = list(tmp_path.glob(".avg.*.partial"))
    assert len(leftovers) == 1 and (leftovers[0] / "model.safetensors").is_file()
    with new_folder(tmp_path / "other", command="hf-headattn-average"):  # another output's start: not its leftover
        assert leftovers[0].exists()
    with new_folder(output, command="hf-headattn-average") as live:
        assert not leftovers[0].exists()  # removed at this output's next start
        assert output_files.remove_stale_staging(output) == [] and live.exists()  # this write holds its lock
    assert sorted(path.name for path in tmp_path.iterdir()) == ["avg", "other"]


def test_a_killed_writers_staging_file_is_removed_and_a_file_appears_whole(tmp_path):
    target = tmp_path / "out.en"
    target.write_text("old\n")
    killed_while_writing(f"""
        with output_files.new_file({str(target)!r}) as handle:
            handle.write("half of the new\\n")
            handle.flush()
            die()
    """)
    assert target.read_text() == "old\n" and len(list(tmp_path.glob(".out.en.*.partial"))) == 1
    with pytest.raises(KeyboardInterrupt), new_file(target) as handle:
        handle.write("interrupted")
        raise KeyboardInterrupt
    assert target.read_text() == "old\n" and sorted(path.name for path in tmp_path.iterdir()) == ["out.en"]
    output_files.write_text(target, "new\n")
    assert target.read_text() == "new\n" and target.stat().st_mode & 0o777 == default_mode()
    assert sorted(path.name for path in tmp_path.iterdir()) == ["out.en"]


def test_training_refuses_a_folder_another_command_wrote(tmp_path):
    data = toy_data(tmp_path / "data")
    average = tmp_path / "avg"
    average.mkdir()
    write_record(average, "hf-headattn-average")
    (average / "model.safetensors").write_bytes(b"")
    with pytest.raises(SystemExit) as refused:
        train_command.main(["--train_source", str(data["train.src"]), "--train_target", str(data["train.tgt"]),
                            "--output_dir", str(average), "--max_steps", "1"])
    assert f"--output_dir {average} was written by hf-headattn-average, not by a training run" in str(refused.value)
    assert sorted(path.name for path in average.iterdir()) == [OUTPUT_RECORD, "model.safetensors"]
    assert json.loads((average / OUTPUT_RECORD).read_text())["command"] == "hf-headattn-average"
