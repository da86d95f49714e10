# The README's two commands: `make demo` (main job on the embedded default) and `make test`.
# Both create .venv and install everything they need on a fresh machine.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
# OpenMPI (MPI data_prep tests) and SLURM + munge + PMIx (the real local cluster the launcher tests use).
APT_PACKAGES := openmpi-bin libopenmpi-dev slurmctld slurmd slurm-client munge libpmix-dev

.PHONY: demo test system-deps slurm-cluster slurm-two-nodes venv clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

# torch goes first and pinned: an unpinned resolve would fetch a multi-GB CUDA build.
$(VENV)/.installed-core: $(BIN)/python setup.cfg pyproject.toml
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e '.[data,hf]'
	touch $@

$(VENV)/.installed-test: $(VENV)/.installed-core system-deps
	$(BIN)/pip install -q -e '.[data,hf,mpi,dev,eval,wandb]'
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

test: $(VENV)/.installed-test slurm-cluster slurm-two-nodes
	$(BIN)/python -m pytest -q --durations=15

clean:
	rm -rf $(VENV) demo_out
