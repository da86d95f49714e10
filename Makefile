# The README's two commands: `make demo` (main job on the embedded default) and `make test`.
# Both create .venv and install everything they need on a fresh machine.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
# constraints-cpu.txt pins the torch (CPU build) and megatron-core this machine runs; setup.cfg states ranges.
CONSTRAINTS := constraints-cpu.txt
# Every tested megatron-core but the pinned one (megatron_ext/versions.py, which says what runs where) gets a small
# environment: megatron-core alone in a pip-less venv whose .pth appends the main .venv's site-packages, so torch and
# everything else are installed once and shared. Each runs MATRIX_TESTS; the newest also keeps its fast suite and the
# remaining checkpoint modules.
MCORE_MATRIX := 0.17.1 0.18.2 0.19.2
MCORE_NEWEST := 0.19.2
VENV_NEWEST := .venv-mcore-$(MCORE_NEWEST)
BIN_NEWEST := $(VENV_NEWEST)/bin
# On every minor: each reach exercised (selfcheck), a source tree without pip metadata, a
# checkpoint saved by one process resumed under TP=2 and under PP=2, a save on SIGTERM, and HF export of TP=1 and
# TP=2/PP=2 saves.
MATRIX_TESTS := tests/test_selfcheck.py::test_selfcheck_cpu_part_passes_and_cuda_checks_skip_with_the_reason \
	tests/test_versions.py::test_megatron_source_tree_without_pip_metadata_takes_the_branch_its_code_has \
	tests/trainer/test_train.py::test_parallel_layout_resumed_from_one_process_checkpoint_follows_the_same_loss_curve \
	tests/trainer/test_train.py::test_sigterm_saves_a_checkpoint_and_exits_with_the_requeue_code \
	tests/hf/test_hf_export_checkpoint.py::test_auto_model_logits_equal_megatron_logits
MATRIX_DESELECT := -k "not dp2"
# What the newest minor runs: the fast tests the pinned phase recorded as running Megatron-Core code in any of their
# processes, or sharing a fixture that did (tests/megatron_record.py: the rule, and tests/test_megatron_record.py: its
# check), and the slow checkpoint tests; the rest run the same code on every Megatron-Core. Without the record (the
# target run alone) every fast test runs.
MEGATRON_RECORD := .test-megatron-record.tsv
# The newest minor's slow part: the whole checkpoint modules and the pinned -> newest upgrade.
NEWEST_CHECKPOINT_TESTS := tests/trainer/test_train.py tests/trainer/test_faults_checkpoint.py tests/trainer/test_megatron_upgrade.py \
	tests/hf/test_hf_export_checkpoint.py \
	tests/test_versions.py::test_megatron_source_tree_without_pip_metadata_takes_the_branch_its_code_has
# OpenMPI (MPI data_prep tests) and SLURM + munge + PMIx (the real local cluster the launcher tests use).
APT_PACKAGES := openmpi-bin libopenmpi-dev slurmctld slurmd slurm-client munge libpmix-dev

.PHONY: demo test test-newest-megatron test-megatron-matrix coverage system-deps slurm-cluster slurm-two-nodes venv clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

# torch is named and pinned in the same resolution as the rest: an unpinned one would fetch a multi-GB CUDA build.
$(VENV)/.installed-core: $(BIN)/python setup.cfg pyproject.toml $(CONSTRAINTS)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -c $(CONSTRAINTS) torch -e '.[data,hf]'
	touch $@

# The test environment in one resolution, without pip's byte-compilation of every file of its ~135 packages (~50 s
# on one core): `make test` keeps bytecode caches on, so a module is compiled once, when something first imports it
# (a fresh venv here, 2026-12-03: 129 s for torch and then the rest, compiled; 63 s for this). It satisfies
# .installed-core too. system-deps is order-only: it checks the Debian packages every time, but a present package
# set must not re-run the pip install (it did, in every later phase of `make test`).
$(VENV)/.installed-test: $(BIN)/python setup.cfg pyproject.toml $(CONSTRAINTS) | system-deps
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q --no-compile -c $(CONSTRAINTS) torch -e '.[data,hf,mpi,dev,eval,wandb]'
	touch $(VENV)/.installed-core $@

# megatron-core >= 0.17 declares Requires-Python >= 3.12, but its code runs on this Python 3.11 (the tests say so):
# it is installed with --no-deps --ignore-requires-python (its own requirements, torch, numpy and packaging, are the
# main environment's). Its site-packages comes first on sys.path, so this megatron-core shadows the pinned one.
.venv-mcore-%/.installed: $(VENV)/.installed-test
	rm -rf .venv-mcore-$*
	$(BIN)/python -m venv --without-pip .venv-mcore-$*
	site=$$(.venv-mcore-$*/bin/python -c "import sysconfig; print(sysconfig.get_paths()['purelib'])") && \
	main=$$($(BIN)/python -c "import sysconfig; print(sysconfig.get_paths()['purelib'])") && \
	echo "import site; site.addsitedir('$$main')" > $$site/main_environment.pth && \
	.venv-mcore-$*/bin/python -m pip install -q --no-compile --no-deps --ignore-requires-python --target $$site \
		megatron-core==$*
	.venv-mcore-$*/bin/python -c "import importlib.metadata as m; assert m.version('megatron-core') == '$*'"
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
# daemons, timeouts), so 4 workers keep 2 cores busy (3 took 19.3 min for the pinned phase, 4 took 16.7, same
# tree and machine, 2026-12-02; docs/testing.md). One work unit is a test module (its module-scoped fixtures run
# once), the SLURM cluster modules are one unit between them (tests/conftest.py), and the slowest units start first.
TEST_WORKERS ?= 4
PYTEST_WORKERS := -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder
# Every phase of `make test` is timed (tests/ci_phases.py) and the table printed against the budget (docs/testing.md).
TEST_BUDGET_MINUTES := 20
PHASE_LOG := .test-phases.tsv
PHASE := $(PYTHON) tests/ci_phases.py --log $(PHASE_LOG)

# The whole suite on the pinned megatron-core, then the newest tested one's part (test-newest-megatron).
# Bytecode caches stay on for the suite whatever the shell says (PYTHONDONTWRITEBYTECODE=1 here): without them each
# of its ~1,000 Python processes compiles our modules again and each pytest process rewrites every test module's
# asserts (~3.5 CPU-s); the matrix phase alone took 55 s with the variable set and 45 s without.
test: export PYTHONDONTWRITEBYTECODE :=
test:
	@$(PHASE) start
	@$(PHASE) run "install .venv and Debian packages" -- $(MAKE) --no-print-directory $(VENV)/.installed-test
	@$(PHASE) run "start the local SLURM clusters" -- $(MAKE) --no-print-directory slurm-cluster slurm-two-nodes
	@rm -f $(MEGATRON_RECORD)
	@$(PHASE) run "whole suite, pinned megatron-core" -- env POSAUG_MEGATRON_RECORD=$(CURDIR)/$(MEGATRON_RECORD) \
		POSAUG_UNIT_TIMES=$(CURDIR)/.test-times-pinned.tsv $(BIN)/python -m pytest -q --durations=15 $(PYTEST_WORKERS)
	@$(PHASE) run "install $(VENV_NEWEST)" -- $(MAKE) --no-print-directory $(VENV_NEWEST)/.installed
	@$(PHASE) run "megatron-core $(MCORE_NEWEST): fast suite and checkpoint tests" -- \
		$(MAKE) --no-print-directory test-newest-megatron
	@$(PHASE) run "megatron-core $(filter-out $(MCORE_NEWEST),$(MCORE_MATRIX)): matrix tests" -- \
		$(MAKE) --no-print-directory test-megatron-matrix
	@$(PHASE) report --budget-minutes $(TEST_BUDGET_MINUTES)

# One pytest run (one start-up and collection per worker) for both parts.
test-newest-megatron: $(VENV_NEWEST)/.installed
	POSAUG_UNIT_TIMES=$(CURDIR)/.test-times-newest.tsv \
		$(BIN_NEWEST)/python -m pytest -q -p no:cacheprovider $(PYTEST_WORKERS) --megatron-record=$(MEGATRON_RECORD) \
		--megatron-slow="$(NEWEST_CHECKPOINT_TESTS)" tests

# MATRIX_TESTS on every minor of MCORE_MATRIX but the newest (test-newest-megatron covers it), the minors side by
# side (two workers each: a run is mostly its start-up and collection), each one's output shown after both end.
MATRIX_LOGS := .test-matrix
test-megatron-matrix: $(foreach version,$(filter-out $(MCORE_NEWEST),$(MCORE_MATRIX)),.venv-mcore-$(version)/.installed)
	@mkdir -p $(MATRIX_LOGS); pids=""; for version in $(filter-out $(MCORE_NEWEST),$(MCORE_MATRIX)); do \
	  .venv-mcore-$$version/bin/python -m pytest -q -p no:cacheprovider -n 2 --dist loadfile $(MATRIX_DESELECT) \
	    $(MATRIX_TESTS) > $(MATRIX_LOGS)/$$version.log 2>&1 & pids="$$pids $$!"; \
	done; status=0; for pid in $$pids; do wait $$pid || status=1; done; \
	for version in $(filter-out $(MCORE_NEWEST),$(MCORE_MATRIX)); do \
	  echo "megatron-core $$version: MATRIX_TESTS"; cat $(MATRIX_LOGS)/$$version.log; \
	done; exit $$status

# Line coverage of the packages over the whole suite, subprocesses included (docs/testing.md keeps the table).
coverage: $(VENV)/.installed-test
	bash tests/coverage.sh

clean:
	rm -rf $(VENV) .venv-mcore-* demo_out $(PHASE_LOG) $(MEGATRON_RECORD) $(MATRIX_LOGS) .coverage-data

# ---- llama.cpp (issue 70): every export kind converted by llama.cpp's own converter and run in llama.cpp ----
# Not part of `make test`: llama-cpp-python builds llama.cpp from source (~17 min on 2 cores; pip caches the wheel,
# so only a fresh machine pays it). Its vendored converter is unpacked from the same release's source package into
# .llama-cpp/ (none of its code enters the repo). The last run's output, with its commit, is LLAMA_CPP_RESULT.
LLAMA_CPP_PYTHON := 0.3.36
LLAMA_CPP_SRC := .llama-cpp
LLAMA_CPP_TREE := llama_cpp_python-$(LLAMA_CPP_PYTHON)/vendor/llama.cpp
LLAMA_CPP_RESULT := benchmarks/results/llama_cpp_gguf.txt

.PHONY: test-llama-cpp llama-cpp-converter

$(VENV)/.installed-llama-cpp: $(VENV)/.installed-test
	CMAKE_BUILD_PARALLEL_LEVEL=$${CMAKE_BUILD_PARALLEL_LEVEL:-2} \
		$(BIN)/pip install -q -c $(CONSTRAINTS) -e '.[data,hf,mpi,dev,eval,wandb,llama-cpp]'
	touch $@

$(LLAMA_CPP_SRC)/$(LLAMA_CPP_TREE)/convert_hf_to_gguf.py: | $(VENV)/.installed-core
	mkdir -p $(LLAMA_CPP_SRC)
	$(BIN)/pip download -q --no-binary :all: --no-deps -d $(LLAMA_CPP_SRC) llama-cpp-python==$(LLAMA_CPP_PYTHON)
	tar -xzf $(LLAMA_CPP_SRC)/llama_cpp_python-$(LLAMA_CPP_PYTHON).tar.gz -C $(LLAMA_CPP_SRC) \
		$(LLAMA_CPP_TREE)/convert_hf_to_gguf.py $(LLAMA_CPP_TREE)/conversion $(LLAMA_CPP_TREE)/gguf-py
	touch $@

llama-cpp-converter: $(LLAMA_CPP_SRC)/$(LLAMA_CPP_TREE)/convert_hf_to_gguf.py

test-llama-cpp: $(VENV)/.installed-llama-cpp llama-cpp-converter
	@mkdir -p $(dir $(LLAMA_CPP_RESULT))
	@status=0; { echo "make test-llama-cpp at commit $$(git rev-parse --short HEAD)$$(git diff --quiet HEAD -- \
		pretrain tests/llama_cpp || echo ' + uncommitted changes'), $$(date -u +%Y-%m-%dT%H:%MZ), llama-cpp-python \
		$(LLAMA_CPP_PYTHON)"; LLAMA_CPP_DIR=$(CURDIR)/$(LLAMA_CPP_SRC)/$(LLAMA_CPP_TREE) $(BIN)/python -m pytest -q \
		-p no:cacheprovider -n 0 --durations=0 tests/llama_cpp; } > $(LLAMA_CPP_RESULT).tmp 2>&1 || status=$$?; \
	cat $(LLAMA_CPP_RESULT).tmp; mv $(LLAMA_CPP_RESULT).tmp $(LLAMA_CPP_RESULT); exit $$status
