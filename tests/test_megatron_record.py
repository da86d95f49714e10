"""The rule that picks the newest megatron-core phase's modules (tests/megatron_record.py): a module whose tests run
Megatron-Core code in any process is recorded, one that runs none is not, and the phase runs only recorded ones."""

import os
import subprocess
import sys
import textwrap

import pytest

import megatron_record
from conftest import REPO

MODULES = {
    "test_calls_a_reach.py": """
        def test_reach():
            from megatron_ext import versions
            assert versions.find("causal_mask") is not None
    """,
    "test_imports_megatron_at_module_level.py": """
        import megatron.core  # noqa: F401
        def test_nothing():
            pass
    """,
    "test_reaches_megatron_through_our_module.py": """
        from megatron_ext import rope_attention  # imports megatron when imported
        def test_nothing():
            assert rope_attention
    """,
    "test_execs_a_process.py": """
        import subprocess
        def test_exec():
            subprocess.run(["bash", "-c", "true"], check=True)
    """,
    "test_execs_python_without_the_tests_environment.py": """
        import os, subprocess, sys
        def test_exec():
            subprocess.run([sys.executable, "-c", "pass"], env={"PATH": os.environ["PATH"]}, check=True)
    """,
    "test_execs_python_that_imports_megatron.py": """
        import os, subprocess, sys
        def test_exec():
            subprocess.run([sys.executable, "-c", "import megatron.core"], check=True,
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


@pytest.fixture(scope="module")
def record(tmp_path_factory):
    """Run MODULES under the pinned phase's recording; returns (record file, test directory)."""
    root = tmp_path_factory.mktemp("recorded")
    for name, source in MODULES.items():
        (root / name).write_text(textwrap.dedent(source))
    path = root / "record.tsv"
    env = dict(os.environ, PYTHONPATH=f"{REPO / 'tests'}:{REPO}", REPO=str(REPO), CUDA_VISIBLE_DEVICES="",
               **{megatron_record.RECORD_ENV: str(path)})
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "conftest",
                           "--rootdir", str(root), str(root)], cwd=root, env=env, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return path, root


def test_a_module_that_calls_a_reach_is_recorded(record):
    assert "test_calls_a_reach.py" in megatron_record.recorded_modules(record[0])


def test_a_module_importing_megatron_directly_or_through_our_module_is_recorded(record):
    recorded = megatron_record.recorded_modules(record[0])
    assert {"test_imports_megatron_at_module_level.py", "test_reaches_megatron_through_our_module.py"} <= recorded


def test_a_module_that_execs_a_process_it_cannot_watch_is_recorded(record):
    recorded = megatron_record.recorded_modules(record[0])
    assert {"test_execs_a_process.py", "test_execs_python_without_the_tests_environment.py"} <= recorded


def test_a_python_exec_ed_from_a_test_is_recorded_by_the_imports_it_executes(record):
    lines = [line.split("\t") for line in record[0].read_text().splitlines()]
    assert ["test_execs_python_that_imports_megatron.py", "import megatron.core"] in lines


def test_a_training_forked_from_the_zygote_is_recorded_by_the_imports_it_executes(record):
    lines = [line.split("\t") for line in record[0].read_text().splitlines()]
    assert any(module == "test_a_forked_training.py" and not reason.startswith("exec") for module, reason in lines)


def test_modules_that_run_no_megatron_code_are_not_recorded(record):
    recorded = megatron_record.recorded_modules(record[0])
    assert not recorded & {"test_pure_positions.py", "test_a_forked_cli_that_stops_before_megatron.py",
                           "test_execs_python_that_runs_no_megatron.py"}


def test_the_newest_phase_collects_only_the_recorded_modules_and_everything_without_a_record(record):
    path, root = record

    def collected(record_file):
        proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "--collect-only", "-p", "no:cacheprovider",
                               "-p", "conftest", "--rootdir", str(root), "--megatron-modules", str(record_file),
                               str(root)], cwd=root, env=dict(os.environ, PYTHONPATH=f"{REPO / 'tests'}:{REPO}"),
                              capture_output=True, text=True, timeout=300)
        return {line.split("::")[0] for line in proc.stdout.splitlines() if "::" in line}

    assert collected(path) == megatron_record.recorded_modules(path)
    assert collected(root / "absent.tsv") == set(MODULES)


def test_our_modules_that_import_megatron_when_imported_are_found_from_the_source():
    found = megatron_record.megatron_at_import()
    assert "megatron_ext.rope_attention" in found and "megatron_ext.positions.strategies" not in found
