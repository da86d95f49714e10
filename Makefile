# The README's two commands: `make demo` (main job on the embedded default) and `make test`.
# Both create .venv and install everything they need on a fresh machine.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
# constraints-cpu.txt pins the torch (CPU build) and megatron-core this machine runs; setup.cfg states ranges.
CONSTRAINTS := constraints-cpu.txt
# The newest megatron-core of the tested range (megatron_ext/versions.py) gets its own environment in `make test`.
MCORE_NEWEST := 0.19.2
VENV_NEWEST := .venv-mcore-$(MCORE_NEWEST)
BIN_NEWEST := $(VENV_NEWEST)/bin
# Its fast suite, plus the slow tests that save, resume and export Megatron checkpoints (the API that moved in 0.19).
NEWEST_CHECKPOINT_TESTS := tests/trainer/test_train.py tests/trainer/test_faults_checkpoint.py tests/trainer/test_megatron_upgrade.py \
	tests/hf/test_hf_export_checkpoint.py
# OpenMPI (MPI data_prep tests) and SLURM + munge + PMIx (the real local cluster the launcher tests use).
APT_PACKAGES := openmpi-bin libopenmpi-dev slurmctld slurmd slurm-client munge libpmix-dev

.PHONY: demo test test-newest-megatron system-deps slurm-cluster slurm-two-nodes venv clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

# torch goes first and pinned: an unpinned resolve would fetch a multi-GB CUDA build.
$(VENV)/.installed-core: $(BIN)/python setup.cfg pyproject.toml $(CONSTRAINTS)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -c $(CONSTRAINTS) torch
	$(BIN)/pip install -q -c $(CONSTRAINTS) -e '.[data,hf]'
	touch $@

$(VENV)/.installed-test: $(VENV)/.installed-core system-deps
	$(BIN)/pip install -q -c $(CONSTRAINTS) -e '.[data,hf,mpi,dev,eval,wandb]'
	touch $@

# megatron-core >= 0.17 declares Requires-Python >= 3.12, but its code runs on this Python 3.11 (the suite passes):
# it is installed first with --no-deps --ignore-requires-python (its own requirements, torch, numpy and packaging,
# come with ours), and the project's install then keeps it because it satisfies setup.cfg's range.
$(BIN_NEWEST)/python:
	$(PYTHON) -m venv $(VENV_NEWEST)

$(VENV_NEWEST)/.installed: $(BIN_NEWEST)/python setup.cfg pyproject.toml $(CONSTRAINTS) system-deps
	$(BIN_NEWEST)/pip install -q --upgrade pip
	$(BIN_NEWEST)/pip install -q -c $(CONSTRAINTS) torch
	$(BIN_NEWEST)/pip install -q --no-deps --ignore-requires-python megatron-core==$(MCORE_NEWEST)
	grep -v '^megatron-core==' $(CONSTRAINTS) > $(VENV_NEWEST)/constraints.txt
	echo 'megatron-core==$(MCORE_NEWEST)' >> $(VENV_NEWEST)/constraints.txt
	$(BIN_NEWEST)/pip install -q -c $(VENV_NEWEST)/constraints.txt -e '.[data,hf,mpi,dev,eval,wandb]'
	touch $@

venv: $(VENV)/.installed-core

# Debian packages the tests need.
system-deps:
	@missing=""; for p in $(APT_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
	  echo "installing Debian packages:$$missing"; \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq $$missing >/dev/null; \
	fi

# A single-node SLURM cluster on localhost (idempotent); tests submit the real launchers to it.
slurm-cluster: system-deps
	$$( [ "$$(id -u)" = 0 ] || echo sudo ) bash slurm/local/start.sh

# A two-node SLURM cluster in network namespaces (idempotent), next to the single-node one. Exit code 3 means
# this machine cannot host it (no root or no netns rights): its tests then skip and print the reason.
slurm-two-nodes: system-deps
	$$( [ "$$(id -u)" = 0 ] || echo sudo ) bash slurm/local/start_two_nodes.sh || [ $$? = 3 ]

demo: $(VENV)/.installed-core
	$(BIN)/python -m pretrain demo --output demo_out

# Parallel pytest (pytest-xdist, the dev extra): most of the suite's wall time is waiting (subprocess start-up,
# daemons, timeouts), so 3 workers keep 2 cores busy. One work unit is a test module (its module-scoped fixtures run
# once), the SLURM cluster modules are one unit between them (tests/conftest.py), and the slowest units start first.
TEST_WORKERS ?= 3
PYTEST_WORKERS := -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder
# Every phase of `make test` is timed (tests/ci_phases.py) and the table printed against the budget (docs/testing.md).
TEST_BUDGET_MINUTES := 40
PHASE_LOG := .test-phases.tsv
PHASE := $(PYTHON) tests/ci_phases.py --log $(PHASE_LOG)

# The whole suite on the pinned megatron-core, then the newest tested one's part (test-newest-megatron).
test:
	@$(PHASE) start
	@$(PHASE) run "install .venv and Debian packages" -- $(MAKE) --no-print-directory $(VENV)/.installed-test
	@$(PHASE) run "start the local SLURM clusters" -- $(MAKE) --no-print-directory slurm-cluster slurm-two-nodes
	@$(PHASE) run "whole suite, pinned megatron-core" -- \
		$(BIN)/python -m pytest -q --durations=15 $(PYTEST_WORKERS)
	@$(PHASE) run "install $(VENV_NEWEST)" -- $(MAKE) --no-print-directory $(VENV_NEWEST)/.installed
	@$(PHASE) run "megatron-core $(MCORE_NEWEST): fast suite and checkpoint tests" -- \
		$(MAKE) --no-print-directory test-newest-megatron
	@$(PHASE) report --budget-minutes $(TEST_BUDGET_MINUTES)

test-newest-megatron: $(VENV_NEWEST)/.installed
	$(BIN_NEWEST)/python -m pytest -q -m "not slow" -p no:cacheprovider $(PYTEST_WORKERS)
	$(BIN_NEWEST)/python -m pytest -q -m slow -p no:cacheprovider $(PYTEST_WORKERS) $(NEWEST_CHECKPOINT_TESTS)

clean:
	rm -rf $(VENV) $(VENV_NEWEST) demo_out $(PHASE_LOG)
