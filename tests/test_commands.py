"""What a newcomer meets first: the installed commands and their --help, the import time of the package, and
quiet output (no Python warnings) from training, the demo and evaluation."""

import argparse
import gc
import json
import importlib
import inspect
import logging
import platform
import re
import runpy
import shutil
import subprocess
import sys
import warnings
from importlib.metadata import entry_points
from types import SimpleNamespace

import pytest

from hf_headattn import demo
from hf_headattn import cli
from hf_headattn.cli import UnderscoreArgumentParser, underscore_spellings
from hf_headattn.commands import demo as demo_command
from hf_headattn.evaluation import evaluate_model
from hf_headattn.metrics import bleu_by_length, corpus_scores
from hf_headattn.runtime.attention_registry import ATTENTION_VARIANTS
from hf_headattn.toy_corpus import make_toy_corpus

from helpers import COMMANDS, REPO, toy_data, train_tiny_model


def check_help(text: str, words: list[str]) -> None:
    assert "(default:" in text, "--help shows no defaults"
    assert "examples:" in text
    assert ":func:" not in text and ":mod:" not in text and "``" not in text, "Sphinx markup in --help"
    missing = [word for word in words if word not in text]
    assert not missing, f"--help does not mention {missing}"


def test_every_command_is_an_installed_console_script():
    installed = {entry.name: entry.value for entry in entry_points(group="console_scripts")
                 if entry.name.startswith("hf-headattn-")}
    assert installed == {name: f"{module}:main" for name, (module, _) in COMMANDS.items()}, \
        "pyproject.toml's [project.scripts] differs from the installed ones: run `pip install -e .`"
    assert all(shutil.which(name) for name in COMMANDS)


def test_console_scripts_answer_help():
    # all at once: each process spends most of its time importing torch
    processes = {name: subprocess.Popen([name, "--help"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                        text=True, cwd=REPO) for name in COMMANDS}
    for name, process in processes.items():
        output, _ = process.communicate(timeout=300)
        assert process.returncode == 0, f"{name} --help:\n{output}"
        check_help(output, COMMANDS[name][1])


def check_help_imports_none_of(command: str, modules: tuple[str, ...]) -> None:
    """Run `command --help` in a fresh interpreter; it must show defaults and leave `modules` unimported."""
    script = (f"import sys, time\nstart = time.perf_counter()\nsys.argv = [{command!r}, '--help']\n"
              f"from {COMMANDS[command][0]} import main\ntry:\n    main()\nexcept SystemExit:\n    pass\n"
              f"imported = [name for name in {modules!r} if name in sys.modules]\n"
              "print(f'{time.perf_counter() - start:.3f}', ','.join(imported), file=sys.stderr)\n")
    finished = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True, cwd=REPO)
    seconds, imported = finished.stderr.strip().splitlines()[-1].partition(" ")[::2]
    print(f"{command} --help: {float(seconds):.2f} s in a fresh interpreter")
    assert "(default:" in finished.stdout
    assert not imported, f"{command} --help imported {imported}"


@pytest.mark.parametrize("command", ["hf-headattn-evaluate", "hf-headattn-plot", "hf-headattn-hub",
                                     "hf-headattn-translate", "hf-headattn-average", "hf-headattn-app"])
def test_help_of_the_tools_imports_no_heavy_library(command):
    """--help of the commands whose flags need no model code answers without torch, Transformers, matplotlib,
    sacrebleu or gradio (train's flags are Trainer's dataclass and demo's choices the variant registry, which need torch)."""
    check_help_imports_none_of(command, ("torch", "transformers", "matplotlib", "sacrebleu", "datasets", "gradio"))


def test_train_help_imports_neither_trainer_nor_datasets_nor_the_models():
    """The training command's flags need Trainer's argument dataclass (and so torch) and the variant registry, but
    not Trainer itself, `datasets`, sacrebleu or the modeling files: those load after parsing."""
    check_help_imports_none_of("hf-headattn-train", (
        "transformers.trainer", "transformers.modeling_utils", "datasets", "sacrebleu", "hf_headattn.training.trainer",
        "hf_headattn.runtime.modeling_headattn", "hf_headattn.runtime.modeling_headattn_rnn"))


@pytest.mark.parametrize("module,words", [command for command in COMMANDS.values()], ids=list(COMMANDS))
def test_python_m_forms_answer_help(module, words, monkeypatch, capsys):
    # what `python -m <module> --help` runs: the module as __main__ (in this process, where imports are done)
    monkeypatch.setattr(sys, "argv", [module, "--help"])
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*found in sys.modules", category=RuntimeWarning)
        with pytest.raises(SystemExit) as exit_info:
            runpy.run_module(module, run_name="__main__")
    assert exit_info.value.code == 0
    check_help(capsys.readouterr().out, words)


@pytest.mark.parametrize("name", list(COMMANDS))
def test_every_command_says_its_version(name, capsys):
    import importlib

    import hf_headattn

    main = importlib.import_module(COMMANDS[name][0]).main
    with pytest.raises(SystemExit) as exit_info:
        main(["--version"])
    assert exit_info.value.code == 0
    assert capsys.readouterr().out.strip().endswith(f"(hf_headattn) {hf_headattn.__version__}")


def test_the_package_says_its_version_and_points_to_the_commands_and_guides():
    import hf_headattn
    from importlib.metadata import version

    assert hf_headattn.__version__ == version("hf_headattn")
    assert "hf-headattn-train" in hf_headattn.__doc__ and "docs/" in hf_headattn.__doc__


def test_python_m_hf_headattn_lists_every_command():
    listing = subprocess.run([sys.executable, "-m", "hf_headattn"], capture_output=True, text=True, check=True,
                             cwd=REPO).stdout
    for name, (module, _) in COMMANDS.items():
        assert f"{name} " in listing and f"({module.removeprefix('hf_headattn.commands.')})" in listing


def command_parsers(module: str) -> dict[str, argparse.ArgumentParser]:
    """The parser of a command's module (its `make_parser`) and those of its subcommands, by name."""
    parser = importlib.import_module(module).make_parser()
    parsers = {module: parser}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            parsers.update({f"{module} {name}": subparser for name, subparser in action.choices.items()})
    return parsers


DASHED_FLAG = re.compile(r"(?<![\w-])--[a-z0-9]+(?:_[a-z0-9]+)*-[a-z0-9_-]+")


@pytest.mark.parametrize("module", [module for module, _ in COMMANDS.values()], ids=list(COMMANDS))
def test_every_command_takes_underscore_flags_with_dashed_aliases_and_shows_the_underscore_form(module):
    """One flag convention (Transformers'): `--output_dir`, `--num_beams`; `--output-dir` works as an alias; `--help`
    shows the underscore form only."""
    for name, parser in command_parsers(module).items():
        for action in parser._actions:
            flags = [option for option in action.option_strings if option.startswith("--")]
            shown = underscore_spellings(flags)
            assert not [flag for flag in shown if "-" in flag[2:]], f"{name}: {shown} is not spelled with underscores"
            for flag in (flag for flag in shown if "_" in flag):
                dashed = flag.replace("_", "-")
                # UnderscoreArgumentParser respells a dashed flag it knows; HfArgumentParser declares both
                assert isinstance(parser, UnderscoreArgumentParser) or dashed in flags, \
                    f"{name}: {dashed} is not an alias of {flag}"
        # (a description may name an alias as such: "the dashed spelling (--num-beams) works too")
        shown_help = DASHED_FLAG.findall(re.sub(r"dashed spelling \(--[\w-]+\)", "", parser.format_help()))
        assert not shown_help, f"{name} --help shows dashed flags: {shown_help}"


def test_dashed_aliases_parse_to_the_underscore_flags():
    from hf_headattn.commands.evaluate import make_parser as evaluation_parser
    from hf_headattn.commands.hub import make_parser as hub_parser

    required = ["--model", "m", "--source", "s", "--reference", "r"]
    assert (vars(evaluation_parser().parse_args([*required, "--output-dir", "o", "--num-beams", "2"]))
            == vars(evaluation_parser().parse_args([*required, "--output_dir", "o", "--num_beams", "2"])))
    card = ["card", "--model", "m", "--evaluation", "e.json", "--dataset-name", "toy", "--repo-id", "a/b"]
    parsed = hub_parser().parse_args(card)
    assert (parsed.dataset_name, parsed.repo_id) == ("toy", "a/b")
    assert "--dataset_name" in command_parsers("hf_headattn.commands.hub")["hf_headattn.commands.hub card"].format_help()


@pytest.mark.parametrize("command", ["head-importances", "attention-map", "bleu-by-length"])
def test_plot_subcommands_show_defaults(command, capsys):
    from hf_headattn.commands.plot import main

    with pytest.raises(SystemExit) as exit_info:
        main([command, "--help"])
    assert exit_info.value.code == 0
    check_help(capsys.readouterr().out, ["--output"])


def test_import_is_fast_and_loads_no_heavy_dependency():
    script = ("import sys, time\n"
              "start = time.perf_counter()\n"
              "import hf_headattn\n"
              "seconds = time.perf_counter() - start\n"
              "heavy = sorted(name for name in ('torch', 'transformers', 'datasets', 'evaluate', 'sacrebleu',\n"
              "                                 'matplotlib', 'eflomal') if name in sys.modules)\n"
              "print(f'{seconds:.3f}', ','.join(heavy))\n")
    seconds, heavy = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True,
                                    cwd=REPO).stdout.strip().partition(" ")[::2]
    print(f"import hf_headattn: {float(seconds):.3f} s in a fresh interpreter")
    assert not heavy, f"import hf_headattn imports {heavy}"
    assert float(seconds) < 3.0


def test_package_names_load_on_first_use():
    import hf_headattn

    assert set(hf_headattn.__all__) <= set(dir(hf_headattn))
    for name in hf_headattn.__all__:
        assert getattr(hf_headattn, name) is not None
    with pytest.raises(AttributeError, match="no attribute 'NoSuchThing'"):
        hf_headattn.NoSuchThing  # noqa: B018


def test_demo_cross_attention_choices_are_the_registry_s():
    assert set(demo_command.CROSS_ATTENTION_VARIANTS) == {
        name for name, variant in ATTENTION_VARIANTS.items() if "cross_attention" in variant.sites}


class WarningRecords(logging.Handler):
    """Log records at WARNING and above, from any logger (sacrebleu's "forgot to detokenize" is one)."""

    def __init__(self):
        super().__init__(logging.WARNING)
        self.records = []

    def emit(self, record):
        self.records.append(f"{record.name}: {record.getMessage()}")


@pytest.fixture
def caught_warnings():
    """Python warnings (every one, as under `python -W default`) and WARNING log records of the block."""
    handler = WarningRecords()
    logging.getLogger().addHandler(handler)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("default")
        yield caught, handler.records
    logging.getLogger().removeHandler(handler)


def messages(caught) -> list[str]:
    return [f"{warning.category.__name__}: {warning.message}" for warning in caught]


def test_demo_emits_no_warnings_and_says_what_it_did_in_a_line(tmp_path, caught_warnings, capsys, caplog):
    caught, log_records = caught_warnings
    with caplog.at_level(logging.INFO, logger="hf_headattn.training"):
        demo.run(tmp_path, epochs=0.03)  # a few steps: what is checked is what gets printed, not the translations
    assert not messages(caught)
    assert not log_records
    # short lines for people; the numbers are in demo_results.json and the model's train_results.json
    printed = capsys.readouterr().out.splitlines()
    trained = [line for line in printed if line.startswith("trained ")]
    assert len(trained) == 1 and re.fullmatch(r"trained \d+ steps \| 3,000 pairs \| [\d.]+ min \| train_loss [\d.]+ "
                                              r"\| eval_loss [\d.]+ \| written: .*model", trained[0]), printed
    runaway = json.loads((tmp_path / "demo_results.json").read_text())["runaway_lines"]
    why = (rf" \| {len(runaway)} hypothes[ie]s loops? past the reference's end \(test line [\d, ]+\): BLEU counts "
           "each repeated word" if runaway else "")
    assert re.fullmatch(rf"BLEU [\d.]+ \| exact match \d+% \| 100 test sentences{why} \| written: .*model",
                        printed[-1]), printed[-1]


def test_runaway_lines_are_those_far_past_their_references_end():
    references = ["a dog runs .", "two men .", "a cat"]
    hypotheses = ["a dog runs .", "two men men men men men men men men men .", "a cat cat cat cat cat cat"]
    assert demo.runaway_lines(hypotheses, references) == [2]  # 11 words > 2 * 3 + 3; 7 words are not > 2 * 2 + 3


def test_evaluation_emits_no_warnings(tmp_path, caught_warnings):
    data = toy_data(tmp_path / "data")
    model = train_tiny_model(data, tmp_path / "model", "transformer", max_length=48)  # no toy sentence truncated
    caught, log_records = caught_warnings
    evaluate_model(model, data["test.src"], data["test.tgt"], num_beams=2, batch_size=16,
                   train_source=data["train.src"], train_target=data["train.tgt"], output_dir=tmp_path / "eval",
                   drop_runs=1, drop_cache_dir=tmp_path / "cache")  # DROP: eflomal, which cannot be seeded
    assert not messages(caught)
    assert not log_records


def test_bleu_of_tokenised_text_logs_no_detokenisation_warning(caught_warnings):
    # 100 or more hypotheses ending in " ." (as Multi30k's and the toy corpus's do) make sacrebleu log "It looks
    # like you forgot to detokenize your test data" three lines at a time, unless told force=True
    caught, log_records = caught_warnings
    sentences = [source for source, _ in make_toy_corpus(120, seed=0)]
    assert sum(sentence.endswith(" .") for sentence in sentences) >= 100
    scores = corpus_scores(sentences, sentences)
    bleu_by_length(sentences, sentences, sentences)
    assert scores["bleu"] == pytest.approx(100)
    assert not log_records and not messages(caught)


def test_commands_are_quiet_by_default_and_say_more_with_verbose(tmp_path, capfd):
    from hf_headattn.commands import train as train_command
    from hf_headattn.commands import translate as translate_command

    data = toy_data(tmp_path / "data")
    flags = ["--train_source", str(data["train.src"]), "--train_target", str(data["train.tgt"]),
             "--valid_source", str(data["valid.src"]), "--valid_target", str(data["valid.tgt"]),
             "--vocab_size", "200", "--d_model", "32", "--layers", "1", "--heads", "2", "--ffn_dim", "64",
             "--max_steps", "2", "--logging_steps", "1", "--max_length", "12"]
    train_command.main([*flags, "--output_dir", str(tmp_path / "run")])
    out, err = capfd.readouterr()
    result = out.splitlines()[-1]
    assert re.fullmatch(rf"trained 2 steps \| .* \| written: {re.escape(str(tmp_path / 'run'))}", result), result
    assert "train_runtime" not in out  # the result line says it
    library_bars = ("Generating train split", "dropping empty lines", "Writing model shards", "Loading weights")
    assert not [bar for bar in library_bars if bar in err], err
    assert "tokenising" in err  # the command's own bar
    translate_command.main(["--model", str(tmp_path / "run"), "--input", str(data["valid.src"]), "--output",
                            str(tmp_path / "out.en"), "--max_new_tokens", "5"])
    out, err = capfd.readouterr()
    assert "Loading weights" not in err and "`max_new_tokens`" not in err and "max_length" not in err, err
    assert re.match(r"\d+ lines translated", err.strip().splitlines()[-1])
    train_command.main([*flags, "--output_dir", str(tmp_path / "verbose"), "--verbose"])
    assert "Writing model shards" in capfd.readouterr().err


FAULTS_OF_A_GROWING_TENSOR = """
import resource, sys, torch
from hf_headattn.cli import keep_freed_memory
if sys.argv[1] == "keep":
    assert keep_freed_memory()
def grow():  # a cache grown by a slice at each step: a new tensor each time, the old one freed
    x = torch.ones(1 << 20)
    for _ in range(40):
        x = torch.cat([x, torch.ones(1 << 17)])
grow()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
grow()
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


EXIT_WITH_TRITON_LOADED = """
import sys, torch._dynamo, triton  # triton's nanobind bindings, loaded as torch loads them wherever triton is installed
from hf_headattn.cli import skip_exit_collections
skip_exit_collections()
print("the command's output")
sys.exit("error: the command's last line")
"""


def test_exit_prints_no_extension_leak_report_after_the_last_line():
    """The frozen heap is never collected, so triton's nanobind bindings would report their objects as leaked
    (~40 lines under the error message, issue 75); the exit says nothing after the command's own last line."""
    pytest.importorskip("triton", reason="triton is not installed (the `kernels` extra, or torch's CUDA build)")
    plain = subprocess.run([sys.executable, "-c", "import gc, torch._dynamo, triton; gc.freeze()"],
                           capture_output=True, text=True, timeout=300)
    assert "leaked" in plain.stderr  # the report this guards against, as a bare freeze gives it
    result = subprocess.run([sys.executable, "-c", EXIT_WITH_TRITON_LOADED], capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 1
    assert result.stdout == "the command's output\n"
    assert result.stderr == "error: the command's last line\n"


@pytest.mark.skipif(sys.platform != "linux" or platform.libc_ver()[0] != "glibc", reason="glibc's malloc only")
def test_keep_freed_memory_spares_the_page_faults_of_reallocated_tensors():
    """The commands that decode ask malloc to keep freed memory: a tensor reallocated a size larger at every step
    (4 to 24 MiB, as a decoding cache grows) then reuses the pages freed before it instead of faulting in fresh
    ones (measured the second time round, in a fresh process each: ~17,000 page faults by default, ~400 kept)."""
    faults = {setting: int(subprocess.run([sys.executable, "-c", FAULTS_OF_A_GROWING_TENSOR, setting], check=True,
                                          capture_output=True, text=True).stdout)
              for setting in ("default", "keep")}
    assert faults["keep"] * 5 < faults["default"], faults


def test_exit_freezes_the_heap_once_for_every_command(monkeypatch):
    """`cli.skip_exit_collections`: an exit handler freezes the objects before CPython tears down its modules (the
    collections it runs then would walk torch's and Transformers' ~450,000 objects), registered once however often
    a command calls it, and every command's main calls it."""
    script = ("import atexit, gc; from hf_headattn.cli import skip_exit_collections; "
              "atexit.register(lambda: print('frozen at exit:', gc.get_freeze_count() > 0)); "  # runs after the freeze
              "skip_exit_collections()")
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == ["frozen at exit: True"]

    handlers = []  # atexit's stack, as it registers and unregisters (by equality)
    fake_atexit = SimpleNamespace(register=handlers.append,
                                  unregister=lambda func: handlers.__setitem__(slice(None), [
                                      handler for handler in handlers if handler != func]))
    monkeypatch.setattr(cli, "atexit", fake_atexit)
    cli.skip_exit_collections()
    cli.skip_exit_collections()
    assert handlers == [cli.freeze_heap_and_silence_teardown]
    for module, _ in COMMANDS.values():
        main = importlib.import_module(module).main
        assert "skip_exit_collections()" in inspect.getsource(main), module


def test_a_missing_file_is_one_usage_error_in_every_command(tmp_path, capsys):
    """The same words and status wherever a command is given a file that is not there (issue 75: three wordings,
    exits 1 and 2): `PROG: error: --FLAG PATH: no such file`, status 2, before anything is loaded."""
    missing = str(tmp_path / "missing.txt")
    present = tmp_path / "present.txt"
    present.write_text("ein hund .\n", encoding="utf-8")
    (tmp_path / "folder").mkdir()  # evaluate's --model passes its own check, which comes first
    cases = {
        "hf_headattn.commands.train": (["--train_source", missing, "--train_target", str(present),
                                        "--output_dir", str(tmp_path / "run")], "--train_source"),
        "hf_headattn.commands.translate": (["--model", str(tmp_path / "model"), "--input", missing], "--input"),
        "hf_headattn.commands.evaluate": (["--model", str(tmp_path / "folder"), "--source", str(present),
                                           "--reference", missing, "--output_dir", str(tmp_path / "eval")], "--reference"),
        "hf_headattn.commands.plot": (["bleu-by-length", "--results", missing, "--output", str(tmp_path / "f.png")],
                                      "--results"),
    }
    for module, (argv, flag) in cases.items():
        with pytest.raises(SystemExit) as exit_info:
            importlib.import_module(module).main(argv)
        assert exit_info.value.code == 2, module
        program = next(name for name, (command_module, _) in COMMANDS.items() if command_module == module)
        assert capsys.readouterr().err.splitlines()[-1] == f"{program}: error: {flag} {missing}: no such file"
