"""The suite's processes run torch on one OpenMP thread (tests/conftest.py says why: waiting threads spin)."""

import os
import subprocess
import sys

import torch

THREADS = int(os.environ.get("OMP_NUM_THREADS", "0"))


def test_the_suite_sets_one_openmp_thread_unless_the_caller_chose_a_number():
    assert THREADS >= 1, "tests/conftest.py no longer sets OMP_NUM_THREADS before torch is imported"


def test_a_test_worker_runs_torch_on_that_many_threads():
    assert torch.get_num_threads() == THREADS


def test_a_process_a_test_starts_inherits_it():
    out = subprocess.run([sys.executable, "-c", "import torch; print(torch.get_num_threads())"],
                         capture_output=True, text=True, check=True).stdout
    assert int(out) == THREADS
