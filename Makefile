# diffgemma-lsp developer commands. `make help` lists them.
VENV ?= .venv
PYTHON ?= python3
# The CPU build of torch kept on this kind of machine; on a GPU machine use e.g. TORCH_SPEC=torch.
TORCH_SPEC ?= torch==2.13.0
BIN = $(VENV)/bin

.PHONY: help setup serve test lint fix

help:  ## list the commands
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | sed 's/:.*## /\t/'

$(BIN)/diffgemma-lsp: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q "$(TORCH_SPEC)"
	$(BIN)/python -m pip install -q -e '.[test]'
	touch $@

setup: $(BIN)/diffgemma-lsp  ## create .venv and install the project with its test tools

serve: setup  ## set up, then start the engine on the shipped default model (Ctrl-C stops it)
	$(BIN)/diffgemma-engine serve

test: setup  ## run the whole test suite (unit, protocol, engine, end-to-end)
	@$(BIN)/python -m pytest -q -p no:cacheprovider; rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "pytest collected no tests: that is a failure here" >&2; exit 1; fi; exit $$rc

lint: setup  ## ruff check and format check
	$(BIN)/ruff check . && $(BIN)/ruff format --check .

fix: setup  ## ruff fix and format
	$(BIN)/ruff check --fix . && $(BIN)/ruff format .
