# Two commands do all the set-up: `make demo` and `make test`.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.cairn-installed
# What `make demo` needs (Cairn and torch); `make test` adds the rest on top.
DEMO_STAMP := $(VENV)/.cairn-demo-installed

.PHONY: demo test test-under-load lint typecheck unit bench install clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip

# Reinstall when the package's metadata or the pins change. torch is pinned to the CPU wheel
# (an unpinned torch downloads a CUDA build of several GB).
$(DEMO_STAMP): pyproject.toml requirements/constraints.txt | $(BIN)/python
	$(BIN)/python -m pip install -q -c requirements/constraints.txt torch==2.13.0
	$(BIN)/python -m pip install -q -c requirements/constraints.txt -e '.[torch]'
	# The checkout on sys.path too (setuptools' editable finder comes after it): a directory
	# named `cairn` beside a script (a storage path such as /tmp/cairn, for a script in /tmp)
	# is then never imported as an empty namespace package in place of Cairn.
	$(BIN)/python -c 'import os, sysconfig; open(os.path.join(sysconfig.get_paths()["purelib"], "cairn-checkout.pth"), "w").write(os.getcwd() + "\n")'
	touch $(DEMO_STAMP)

$(STAMP): $(DEMO_STAMP) pyproject.toml requirements/constraints.txt examples/xyzstorage/pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install -q -c requirements/constraints.txt -e '.[dev,torch,ray,pandas,plot,huggingface,lightning]'
	# The example store of docs/custom-storage.md, registered as xyz:// by its entry point.
	$(BIN)/python -m pip install -q --no-deps -e examples/xyzstorage
	touch $(STAMP)

install: $(STAMP)

demo: $(DEMO_STAMP)
	$(BIN)/python examples/demo.py

lint: $(STAMP)
	$(BIN)/ruff check cairn tests bench $(wildcard examples)

typecheck: $(STAMP)
	$(BIN)/mypy --strict cairn

unit: $(STAMP)
	$(BIN)/python -m pytest -q -ra --durations=30

test: lint typecheck unit

# `make test` three times in a row beside a busy loop on every core (see CONTRIBUTING.md).
test-under-load:
	bash .ci/under-load 3

bench: $(STAMP)
	$(BIN)/python -m pip install -q -c requirements/constraints.txt 'ray[train]==2.60.0'
	$(BIN)/python bench/run_all.py --write-results

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache
