"""The rule that picks the newest megatron-core phase's tests (tests/megatron_record.py): a test that runs
Megatron-Core code in any process, or shares a fixture whose setup did, is recorded; one that runs none is not; a
process that cannot be watched makes the newest phase run everything; and the phase runs only what is recorded."""

import os
import subprocess
import sys
import textwrap

import pytest

import megatron_record
from conftest import REPO

# The Pythons the tests exec, the module-level import and the fixture import `megatron`, the namespace package: the
# rule counts it as any megatron import, and it executes nothing, where each `import megatron.core` cost ~5 CPU-s
# (in the recorded run and again in each of the three collections).
MODULES = {
    "test_calls_a_reach.py": """
        def test_reach():
            from megatron_ext import versions
            assert versions.find("causal_mask") is not None
        def test_pure_beside_it():
            assert True
    """,
    "test_imports_megatron_at_module_level.py": """
        import megatron  # noqa: F401
        def test_nothing():
            pass
    """,
    "test_reaches_megatron_through_our_module.py": """
        from megatron_ext import rope_attention  # imports megatron when imported
        def test_nothing():
            assert rope_attention
    """,
    "test_shares_a_fixture_that_imports_megatron.py": """
        import pytest
        @pytest.fixture(scope="module")
        def built():
            import megatron  # noqa: F401
            return 1
        def test_first_user(built):
            assert built
        def test_second_user(built):
            assert built
        def test_no_user():
            pass
    """,
    "test_execs_bash_that_runs_python_importing_megatron.py": """
        import subprocess, sys
        def test_exec():
            subprocess.run(["bash", "-c", f"{sys.executable} -c 'import megatron'"], check=True)
    """,
    "test_execs_bash_that_runs_no_megatron.py": """
        import subprocess
        def test_exec():
            subprocess.run(["bash", "-c", "true"], check=True)
    """,
    "test_execs_an_interpreter_it_cannot_watch.py": """
        import subprocess, sys
        def test_without_site_packages():
            subprocess.run([sys.executable, "-S", "-c", "pass"], check=True)
    """,
    "test_execs_python_that_imports_megatron.py": """
        import os, subprocess, sys
        def test_exec():
            subprocess.run([sys.executable, "-c", "import megatron"], check=True,
                           env=dict(os.environ, PYTHONPATH=os.environ["REPO"]))
    """,
    "test_execs_python_that_runs_no_megatron.py": """
        import subprocess, sys
        def test_exec():
            subprocess.run([sys.executable, "-c", "import json"], check=True)
    """,
    "test_pure_positions.py": """
        import torch
        from megatron_ext.positions import strategies
        def test_math():
            assert strategies and torch.arange(3).sum() == 3
    """,
    "test_a_forked_training.py": """
        import os, subprocess, sys
        def test_train(tmp_path):
            env = dict(os.environ, PYTHONPATH=os.environ["REPO"], CUDA_VISIBLE_DEVICES="")
            argv = ["preset=tiny", "data.synthetic=true", "schedule.train_iters=1", "model.vocab_size=512",
                    "schedule.global_batch_size=8", "schedule.micro_batch_size=2", "optimizer.lr_warmup_iters=0",
                    f"checkpoint.save={tmp_path / 'run'}"]
            proc = subprocess.run([sys.executable, "-m", "pretrain", "train", "--set", *argv], env=env)
            assert proc.returncode == 0
    """,
    "test_a_forked_cli_that_stops_before_megatron.py": """
        import os, subprocess, sys
        def test_unknown_command():
            env = dict(os.environ, PYTHONPATH=os.environ["REPO"], CUDA_VISIBLE_DEVICES="")
            assert subprocess.run([sys.executable, "-m", "pretrain", "nope"], env=env).returncode == 2
    """,
}
# Started without the recording environment: recorded as unattributed when it imports megatron, not otherwise.
STRIPPED = {
    "test_execs_python_without_the_tests_environment_that_imports_megatron.py": """
        import os, subprocess, sys
        def test_exec():
            subprocess.run([sys.executable, "-c", "import megatron"], env={"PATH": os.environ["PATH"]},
                           check=True)
    """,
    "test_execs_python_without_the_tests_environment_that_runs_no_megatron.py": """
        import os, subprocess, sys
        def test_exec():
            subprocess.run([sys.executable, "-c", "pass"], env={"PATH": os.environ["PATH"]}, check=True)
    """,
}


def _recorded_run(root, modules: dict[str, str]):
    for name, source in modules.items():
        (root / name).write_text(textwrap.dedent(source))
    path = root / "record.tsv"
    env = dict(os.environ, PYTHONPATH=f"{REPO / 'tests'}:{REPO}", REPO=str(REPO), CUDA_VISIBLE_DEVICES="",
               **{megatron_record.RECORD_ENV: str(path)})
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "conftest",
                           "--rootdir", str(root), str(root)], cwd=root, env=env, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return path


@pytest.fixture(scope="module")
def record(tmp_path_factory):
    """Run MODULES under the pinned phase's recording; returns (record file, test directory)."""
    root = tmp_path_factory.mktemp("recorded")
    return _recorded_run(root, MODULES), root


@pytest.fixture(scope="module")
def stripped_record(tmp_path_factory):
    """Run STRIPPED under a recording; returns {module: the record's lines naming the command its test runs}."""
    path = _recorded_run(tmp_path_factory.mktemp("stripped"), STRIPPED)
    records = lines(path) if path.exists() else []
    return {name: [line for line in records if line[1].endswith(f" -c {command}")]
            for name, command in zip(STRIPPED, ("import megatron", "pass"))}


def lines(path):
    return [line.split("\t")[:2] for line in path.read_text().splitlines()]  # unit, reason (not where)


def test_a_test_that_calls_a_reach_is_recorded_and_its_pure_neighbour_is_not(record):
    units = megatron_record.recorded_units(record[0])
    assert "test_calls_a_reach.py::test_reach" in units
    assert not {"test_calls_a_reach.py", "test_calls_a_reach.py::test_pure_beside_it"} & units


def test_a_module_importing_megatron_directly_or_through_our_module_is_recorded_whole(record):
    units = megatron_record.recorded_units(record[0])
    assert {"test_imports_megatron_at_module_level.py", "test_reaches_megatron_through_our_module.py"} <= units


@pytest.fixture(scope="session")
def unit_seen_by_a_session_fixture():
    """The unit a session-scoped fixture's setup is recorded under, in this very suite (its real conftest layout:
    the recorded runs above load tests/conftest.py as a plugin, where its hooks apply everywhere)."""
    return os.environ.get(megatron_record.UNIT_ENV)


def test_a_session_scoped_fixtures_setup_is_recorded_as_its_own_unit_in_the_suite(unit_seen_by_a_session_fixture):
    assert unit_seen_by_a_session_fixture == "fixture:unit_seen_by_a_session_fixture"


def test_every_user_of_a_shared_fixture_whose_setup_imports_megatron_is_selected(record):
    units = megatron_record.recorded_units(record[0])
    module = "test_shares_a_fixture_that_imports_megatron.py"
    assert "fixture:built" in units and not {f"{module}::test_first_user", module} & units
    assert megatron_record.selected(f"{module}::test_second_user", ["built"], units)
    assert not megatron_record.selected(f"{module}::test_no_user", [], units)


def test_a_python_started_by_bash_is_recorded_by_the_imports_it_executes(record):
    assert ["test_execs_bash_that_runs_python_importing_megatron.py::test_exec", "import megatron"] in lines(
        record[0])
    assert not {"test_execs_bash_that_runs_no_megatron.py", "test_execs_bash_that_runs_no_megatron.py::test_exec"} & (
        megatron_record.recorded_units(record[0]))


def test_an_interpreter_that_cannot_be_watched_counts_when_it_is_exec_ed(record):
    assert ["test_execs_an_interpreter_it_cannot_watch.py::test_without_site_packages", "exec"] in lines(record[0])
    assert megatron_record.exec_counts(["/usr/bin/python3", "-c", "pass"])
    assert not megatron_record.exec_counts([sys.executable, "-u", "-m", "pretrain"])
    assert not megatron_record.exec_counts(["sbatch", "--wait", "job.sh"])


def test_a_python_exec_ed_from_a_test_is_recorded_by_the_imports_it_executes(record):
    assert ["test_execs_python_that_imports_megatron.py::test_exec", "import megatron"] in lines(record[0])


def test_a_training_forked_from_the_zygote_is_recorded_by_the_imports_it_executes(record):
    assert any(unit == "test_a_forked_training.py::test_train" and not reason.startswith("exec")
               for unit, reason in lines(record[0]))


def test_tests_that_run_no_megatron_code_are_not_recorded(record):
    units = {unit.split("::")[0] for unit in megatron_record.recorded_units(record[0])}
    assert not units & {"test_pure_positions.py", "test_a_forked_cli_that_stops_before_megatron.py",
                        "test_execs_python_that_runs_no_megatron.py"}
    assert megatron_record.UNATTRIBUTED not in units


def test_a_python_started_without_the_recording_environment_that_imports_megatron_is_unattributed(stripped_record):
    importing, pure = STRIPPED
    assert {unit for unit, _ in stripped_record[importing]} == {megatron_record.UNATTRIBUTED}
    assert stripped_record[pure] == []


def test_a_process_descending_from_no_recording_run_records_only_into_the_runs_no_test_started(tmp_path,
                                                                                               monkeypatch):
    # a SLURM job descends from slurmd; a pytest run a test starts (this module's) must not take its lines
    monkeypatch.setattr(megatron_record, "_SITE", tmp_path)
    runs = [subprocess.Popen(["sleep", "60"]) for _ in range(2)]
    try:
        for run, started_by in zip(runs, ("top", "test")):
            (tmp_path / f"{megatron_record.LIVE_PREFIX}{run.pid}").write_text(f"record-{started_by}\n{started_by}\n")
        (tmp_path / f"{megatron_record.LIVE_PREFIX}{os.getppid()}").write_text("record-parent\ntest\n")
        assert megatron_record._live_records() == ["record-parent"]  # the nearest run it descends from
        (tmp_path / f"{megatron_record.LIVE_PREFIX}{os.getppid()}").unlink()
        assert megatron_record._live_records() == ["record-top"]
    finally:
        for run in runs:
            run.kill()
            run.wait()
    assert megatron_record._live_records() == []  # a killed run's mark names no record


def test_the_newest_phase_collects_only_the_recorded_tests_and_everything_without_a_usable_record(record, tmp_path):
    path, root = record

    def collected(record_file):
        proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "--collect-only", "-p", "no:cacheprovider",
                               "-p", "conftest", "--rootdir", str(root), f"--megatron-record={record_file}",
                               str(root)], cwd=root, env=dict(os.environ, PYTHONPATH=f"{REPO / 'tests'}:{REPO}"),
                              capture_output=True, text=True, timeout=300)
        return {line for line in proc.stdout.splitlines() if "::" in line}

    units = megatron_record.recorded_units(path)
    everything = collected(root / "absent.tsv")
    chosen = collected(path)
    assert chosen == {test for test in everything if megatron_record.selected(
        test, ["built"] if "test_shares_a_fixture" in test and "no_user" not in test else [], units)}
    assert "test_shares_a_fixture_that_imports_megatron.py::test_second_user" in chosen
    assert "test_calls_a_reach.py::test_pure_beside_it" not in chosen
    unattributed = tmp_path / "unattributed.tsv"
    unattributed.write_text(path.read_text() + f"{megatron_record.UNATTRIBUTED}\timport megatron.core by python\n")
    assert collected(unattributed) == everything


def test_our_modules_that_import_megatron_when_imported_are_found_from_the_source():
    found = megatron_record.megatron_at_import()
    assert "megatron_ext.rope_attention" in found and "megatron_ext.positions.strategies" not in found
