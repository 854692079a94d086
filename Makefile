# The two commands: `make test` and `make demo`. Both create .venv on first use.
# `make install` installs the torch build whose kernels cover this node's GPUs first (common/torch_build.py reads
# `nvidia-smi --query-gpu=compute_cap`: V100 -> the CUDA 12.6 build, Turing and newer -> CUDA 13.0, no GPU -> CPU;
# TORCH_CUDA=cu126|cu130|cpu overrides), replacing a torch of another build; `make torch-plan` prints the choice.
# It comes from the PyTorch wheel index (https://download.pytorch.org/whl/<build>; TORCH_INDEX_URL=<a mirror of
# .../whl> replaces it). That index is asked once first (5 s timeout): where it cannot be reached (a cluster behind
# a PyPI mirror) torch comes from pip's own settings (pip.conf, PIP_INDEX_URL, find-links) and one line says so;
# the CUDA 12.6 build is then pinned as torch==<version>+cu126, so a mirror without it fails by name instead of
# installing the default wheel, which has no V100 kernels.
# `make test` runs the suite on TEST_WORKERS pytest-xdist workers side by side (whole files per worker, the Slurm
# tests as one unit: tests/conftest.py); TEST_WORKERS=0 runs it in one process.
PYTHON ?= python3
TEST_WORKERS ?= 2
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: install torch-plan test lint format demo bench docs clean

$(STAMP): setup.py constraints.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	cmd=$$($(PYTHON) -m common.torch_build_cli plan --python $(PY)) && if [ -n "$$cmd" ]; then $$cmd -q; fi
	$(PY) -m pip install -q -c constraints.txt -e ".[dev]"
	touch $(STAMP)

install: $(STAMP)

torch-plan:
	@$(PYTHON) -m common.torch_build_cli plan

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

format: $(STAMP)
	$(VENV)/bin/ruff format .
	$(VENV)/bin/ruff check --fix .

test: lint
	$(PY) -m pytest -n $(TEST_WORKERS) $(PYTEST_ARGS)

demo: $(STAMP)
	$(PY) -m demo $(DEMO_ARGS)

bench: $(STAMP)
	$(PY) bench/pretrain/model_step.py

# The documentation site (mkdocs.yml, docs/) into site/, strict: a broken link or anchor, or a page left out of the
# nav, fails the build (tests/test_docs.py runs the same check in `make test`).
docs: $(STAMP)
	$(VENV)/bin/mkdocs build --strict --site-dir site

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .ruff_cache
