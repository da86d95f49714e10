# The README's two commands: `make demo` (main job on the embedded default) and `make test`.
# Both create .venv and install everything they need on a fresh machine.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
APT_PACKAGES := openmpi-bin libopenmpi-dev

.PHONY: demo test system-deps venv clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

# torch goes first and pinned: an unpinned resolve would fetch a multi-GB CUDA build.
$(VENV)/.installed-core: $(BIN)/python setup.cfg pyproject.toml
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e '.[data,hf]'
	touch $@

$(VENV)/.installed-test: $(VENV)/.installed-core system-deps
	$(BIN)/pip install -q -e '.[data,hf,mpi,dev]'
	touch $@

venv: $(VENV)/.installed-core

# Debian packages the tests need (OpenMPI for the MPI data_prep tests).
system-deps:
	@missing=""; for p in $(APT_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
	  echo "installing Debian packages:$$missing"; \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq $$missing >/dev/null; \
	fi

demo: $(VENV)/.installed-core
	$(BIN)/python -m pretrain demo --output demo_out

test: $(VENV)/.installed-test
	$(BIN)/python -m pytest -q

clean:
	rm -rf $(VENV) demo_out
