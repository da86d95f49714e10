"""One command-line grammar across `python -m pretrain`, its subcommands and `python -m data_prep`.

Every parser is a pretrain.cli.Parser; these tests capture the parser (or the parsed arguments) each real
command builds, by intercepting Parser.parse_args, and check the grammar on it: repeated `--set` keeps
every value, unknown (sub)commands are refused naming the choices, every default shows in `--help`,
`--seeds` is a list and `--num-seeds` a count, and `--help` imports no torch.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from pretrain.__main__ import COMMANDS
from pretrain.__main__ import main as pretrain_main
from pretrain.cli import SEED_ORDER, Parser, seeds_of

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}


class Captured(Exception):
    """Raised by the intercepted parse_args with what it captured."""


def _capture(monkeypatch, argv: list[str], parse: bool) -> object:
    """The parser (parse=False) or the parsed namespace (parse=True) that `python -m pretrain argv` builds."""

    def intercept(self, args=None, namespace=None):
        raise Captured(argparse.ArgumentParser.parse_args(self, args, namespace) if parse else self)

    monkeypatch.setattr(Parser, "parse_args", intercept)
    with pytest.raises(Captured) as caught:
        if argv[0] == "data_prep":
            from data_prep.cli import main as data_prep_main

            data_prep_main(argv[1:])
        else:
            pretrain_main(argv)
    return caught.value.args[0]


# every command line that reads config overrides, and where its parser keeps them
WITH_SET = [(["train", "113m_posaug"], "overrides"), (["plan", "113m_posaug"], "set"), (["reproduce"], "set"),
            (["reproduce", "--slurm"], "set"), (["import-hf", "--hf", "h", "--output", "o"], "overrides")]
# every parser a user reaches: each command, each reproduce suite, each data_prep command
EVERY_PARSER = [["train"], ["plan"], ["reproduce"], ["reproduce", "--slurm"], ["reproduce", "--suite", "tasks"],
                ["reproduce", "--suite", "ablations"], ["runs", "d"], ["demo"], ["selfcheck"], ["eval", "report", "r"],
                ["export-hf"], ["export-gguf"], ["import-hf"], ["data_prep", "build"]]
# the commands whose --help must not import torch
LIGHT_HELP = [[], ["train"], ["plan"], ["reproduce"], ["reproduce", "--slurm"], ["reproduce", "--suite", "tasks"],
              ["reproduce", "--suite", "ablations"], ["runs"], ["demo"], ["selfcheck"], ["export-hf"], ["export-gguf"],
              ["import-hf"], ["eval"], ["eval", "run"], ["eval", "all"], ["eval", "report"], ["eval", "downstream"]]


@pytest.mark.parametrize("argv,dest", WITH_SET, ids=lambda v: " ".join(v) if isinstance(v, list) else v)
def test_every_command_with_overrides_keeps_every_repeated_set(monkeypatch, argv, dest):
    args = _capture(monkeypatch, [*argv, "--set", "a.b=1", "--set", "c.d=2", "e.f=3"], parse=True)
    assert getattr(args, dest) == ["a.b=1", "c.d=2", "e.f=3"]


def test_plan_applies_both_of_two_sets_to_the_tokens_per_step():
    proc = subprocess.run([sys.executable, "-m", "pretrain", "plan", "113m_posaug", "--set", "model.seq_length=4096",
                           "--set", "schedule.micro_batch_size=1", "--json"], capture_output=True, text=True,
                          env=ENV, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["tokens_per_step"] == 128 * 4096  # 128 sequences of the second --set's length


@pytest.mark.parametrize("argv,message", [
    (["foo"], "unknown command foo; choose from train, demo, eval"),
    (["eval", "reprot"], "unknown command reprot; choose from run, all, report, downstream"),
    (["reproduce", "--suite", "bogus"], "unknown suite bogus; choose from lm, tasks, ablations"),
    (["data_prep", "foo"], "unknown command foo; choose from build, train-tokenizer, inspect, embedded-corpus"),
], ids=lambda v: " ".join(v) if isinstance(v, list) else None)
def test_an_unknown_command_or_suite_is_refused_naming_the_choices(argv, message):
    command = [sys.executable, "-m", "data_prep", *argv[1:]] if argv[0] == "data_prep" else \
        [sys.executable, "-m", "pretrain", *argv]
    proc = subprocess.run(command, capture_output=True, text=True, env=ENV, timeout=300)
    assert proc.returncode == 2 and message in proc.stderr and "Traceback" not in proc.stderr


def _help_blocks(parser: argparse.ArgumentParser) -> dict[str, str]:
    """Option string -> its paragraph of the formatted help."""
    blocks, current = {}, None
    for line in parser.format_help().splitlines():
        stripped = line.strip()
        if line.startswith("  -") and stripped.startswith("-"):
            current = stripped.split()[0].rstrip(",")
            blocks[current] = stripped
        elif current and line.startswith("   "):
            blocks[current] += " " + stripped
        else:
            current = None
    return blocks


def _parsers(parser: argparse.ArgumentParser):
    yield parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                yield from _parsers(sub)


@pytest.mark.parametrize("argv", EVERY_PARSER, ids=" ".join)
def test_every_option_with_a_default_shows_it_in_help(monkeypatch, argv):
    parser = _capture(monkeypatch, [*argv, "--help"], parse=False)
    for each in _parsers(parser):
        blocks = _help_blocks(each)
        for action in each._actions:
            if (not action.option_strings or action.help == argparse.SUPPRESS or action.nargs == 0
                    or action.default in (None, False, [], argparse.SUPPRESS)):  # nargs 0: a switch
                continue
            text = blocks[action.option_strings[0]]
            assert "default" in text, f"{each.prog} {action.option_strings[0]}: no default in help: {text!r}"


@pytest.mark.parametrize("argv", LIGHT_HELP, ids=lambda v: " ".join(v) or "top")
def test_help_does_not_import_torch(argv):
    code = ("import sys\nfrom pretrain.__main__ import main\ntry:\n    main(sys.argv[1:])\nexcept SystemExit:\n"
            "    pass\nassert 'torch' not in sys.modules, 'torch imported'\nprint('ok')")
    proc = subprocess.run([sys.executable, "-c", code, *argv, "--help"], capture_output=True, text=True, env=ENV,
                          timeout=120)
    assert proc.returncode == 0 and proc.stdout.endswith("ok\n"), proc.stderr


def test_the_torch_free_copies_of_the_rope_scaling_tables_equal_the_originals():
    from megatron_ext.positions import scaling
    from pretrain.hf import arguments

    assert arguments.ROPE_SCALING_KINDS == scaling.ROPE_SCALING_KINDS
    assert arguments.ROPE_SCALING_ALIASES == scaling.ROPE_SCALING_ALIASES
    for name in (*scaling.ROPE_SCALING_KINDS, *scaling.ROPE_SCALING_ALIASES, ""):
        assert arguments.cli_scaling_kind(name) == scaling.scaling_kind(name)


def test_data_prep_help_does_not_import_torch():
    code = ("import sys\nfrom data_prep.cli import main\ntry:\n    main(['build', '--help'])\nexcept SystemExit:\n"
            "    pass\nassert 'torch' not in sys.modules\nprint('ok')")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=ENV, timeout=120)
    assert proc.returncode == 0 and proc.stdout.endswith("ok\n"), proc.stderr


def test_reproduce_help_shows_the_suites_and_the_slurm_mode(capsys):
    with pytest.raises(SystemExit):
        pretrain_main(["reproduce", "--help"])
    out = capsys.readouterr().out
    assert "--suite {lm,tasks,ablations,documents}" in out and "--slurm" in out


@pytest.mark.parametrize("argv", [["reproduce"], ["reproduce", "--suite", "tasks"],
                                  ["reproduce", "--suite", "ablations"], ["reproduce", "--slurm"]], ids=" ".join)
def test_seeds_is_a_list_and_num_seeds_a_count_in_every_suite(monkeypatch, argv):
    listed = _capture(monkeypatch, [*argv, "--seeds", "42,137"], parse=True)
    counted = _capture(monkeypatch, [*argv, "--num-seeds", "2"], parse=True)
    assert seeds_of(listed) == seeds_of(counted) == [42, 137] == list(SEED_ORDER[:2])


@pytest.mark.parametrize("argv", [["reproduce"], ["reproduce", "--suite", "tasks"], ["reproduce", "--slurm"]],
                         ids=" ".join)
def test_a_lone_small_seed_is_refused_as_a_count_with_a_hint(argv, capsys):
    with pytest.raises(SystemExit) as exit_:
        pretrain_main([*argv, "--seeds", "2"])
    assert exit_.value.code == 2 and "--num-seeds 2" in capsys.readouterr().err


def test_a_trailing_comma_makes_a_small_number_one_seed(monkeypatch):
    assert seeds_of(_capture(monkeypatch, ["reproduce", "--seeds", "2,"], parse=True)) == [2]


def test_seeds_and_num_seeds_together_are_refused(capsys):
    with pytest.raises(SystemExit) as exit_:
        pretrain_main(["reproduce", "--seeds", "42", "--num-seeds", "2"])
    assert exit_.value.code == 2 and "not allowed with" in capsys.readouterr().err


def test_slurm_mode_is_refused_for_a_suite_without_a_grid(capsys):
    assert pretrain_main(["reproduce", "--suite", "tasks", "--slurm"]) == 2
    assert "--slurm submits the grid of suite lm" in capsys.readouterr().err


def test_train_and_plan_take_a_shipped_config_by_name(monkeypatch):
    from pretrain.cli import config_of

    for command in ("train", "plan"):
        args = _capture(monkeypatch, [command, "113m_posaug"], parse=True)
        assert config_of(args) == str(ROOT / "pretrain" / "configs" / "113m_posaug.yaml")


def test_every_command_is_listed_in_the_top_level_help(capsys):
    assert pretrain_main(["--help"]) == 0
    out = capsys.readouterr().out
    assert all(f"  {name} " in out for name in COMMANDS)


def test_the_data_prefix_is_one_flag_in_data_prep_build_and_reproduce_slurm(monkeypatch):
    for argv in (["data_prep", "build"], ["reproduce", "--slurm"]):
        parser = _capture(monkeypatch, [*argv, "--help"], parse=False)
        shown = {o for each in _parsers(parser) for a in each._actions if a.help != argparse.SUPPRESS
                 for o in a.option_strings}
        assert "--data-prefix" in shown and "--output-prefix" not in shown, argv


def test_the_baseline_has_one_name_in_every_method_list():
    from pretrain.experiments.presets import TRAINING_METHODS
    from pretrain.table import FORMER_NAMES, METHODS
    from pretrain.tasks.presets import METHODS as TASK_METHODS

    for methods in (METHODS, TRAINING_METHODS, TASK_METHODS):
        assert "baseline" in methods and not set(FORMER_NAMES) & set(methods)


# one name per thing: (a former spelling, its dest, the current spelling) of each command that had one
DEPRECATED = [(["eval", "run", "m", "--data", "d", "--out", "V"], "out", "--output"),
              (["eval", "report", "r", "--out", "V"], "out", "--output"),
              (["export-hf", "--checkpoint", "V", "--output", "o"], "checkpoint",
               "the run as the first argument: export-hf RUN --output DIR"),
              (["reproduce", "--corpus", "V"], "corpus", "--input"),
              (["reproduce", "--slurm", "--corpus", "V"], "corpus", "--input")]


@pytest.mark.parametrize("argv,dest,current", DEPRECATED, ids=lambda v: " ".join(v) if isinstance(v, list) else v)
def test_a_former_spelling_still_works_and_prints_one_deprecation_line(monkeypatch, capsys, argv, dest, current):
    from pretrain.cli import _Deprecated

    monkeypatch.setattr(_Deprecated, "said", set())
    args = _capture(monkeypatch, argv, parse=True)
    assert getattr(args, dest) == "V"
    old = next(a for a in argv if a.startswith("--") and a not in ("--data", "--output", "--slurm"))
    [line] = capsys.readouterr().err.splitlines()
    assert line.endswith(f": {old} is deprecated; use {current}")


@pytest.mark.parametrize("argv,old", [(["eval", "run"], "--out"), (["export-hf"], "--checkpoint"),
                                      (["reproduce"], "--corpus")])
def test_a_former_spelling_is_hidden_from_help(monkeypatch, argv, old):
    assert old + " " not in _capture(monkeypatch, argv, parse=False).format_help().replace(old + "put", "")


def test_export_hf_takes_the_run_as_its_first_argument_like_eval_run_and_runs(monkeypatch):
    assert _capture(monkeypatch, ["export-hf", "runs/a", "--output", "o"], parse=True).checkpoint == "runs/a"


def test_a_deprecated_spelling_is_said_once_though_python_m_pretrain_parses_twice(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "pretrain", "export-hf", "--checkpoint", str(tmp_path / "none"),
                           "--output", str(tmp_path / "hf")], capture_output=True, text=True, env=ENV, timeout=300)
    assert proc.returncode == 2 and proc.stderr.count("is deprecated") == 1, proc.stderr
