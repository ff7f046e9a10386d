# diffgemma-lsp developer commands. `make help` lists them.
VENV ?= .venv
PYTHON ?= python3
# The CPU build of torch kept on this kind of machine; on a GPU machine use e.g. TORCH_SPEC=torch. Where pip finds
# no CPU build (PyPI's Linux wheel is the CUDA one): TORCH_INDEX=https://download.pytorch.org/whl/cpu.
TORCH_SPEC ?= torch==2.13.0
TORCH_INDEX ?=
BIN = $(VENV)/bin
# Where `make test-editors` unpacks the editors that no package manager here has.
EDITORS ?= .cache/editors

.PHONY: help setup serve test test-editors lint typecheck fix

help:  ## list the commands
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | sed 's/:.*## /\t/'

# The editable install is setuptools' strict one: a tree of links under build/ that static tools follow (pyright,
# VS Code's Python server), where the default installs an import hook they cannot read and so cannot resolve
# diffgemma_engine, the folder engine/ under its installed name. The tree holds the files there were at install time,
# so the install reruns when the list of source files changes (SOURCE_LIST), not when a file is edited. Its warning
# ("Editable installation ... do not remove build/") is silenced: this Makefile remakes build/ when it is needed.
SOURCE_LIST = .cache/source-files.txt
$(shell mkdir -p .cache && find engine diffgemma_lsp -name '*.py' -not -path '*/__pycache__/*' | sort > $(SOURCE_LIST).new \
  && (cmp -s $(SOURCE_LIST).new $(SOURCE_LIST) || mv $(SOURCE_LIST).new $(SOURCE_LIST)); rm -f $(SOURCE_LIST).new)

$(BIN)/diffgemma-lsp: pyproject.toml $(SOURCE_LIST)
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q "$(TORCH_SPEC)" $(if $(TORCH_INDEX),--index-url "$(TORCH_INDEX)")
	PYTHONWARNINGS="ignore:Editable installation" $(BIN)/python -m pip install -q -e '.[test]' \
	  --config-settings editable_mode=strict
	touch $@

setup: $(BIN)/diffgemma-lsp  ## create .venv and install the project with its test tools

# --exist-ok: an engine already serving the socket is what was asked for; it is said, and make ends cleanly.
serve: setup  ## set up, then start the engine on the shipped default model (Ctrl-C stops it)
	$(BIN)/diffgemma-engine serve --exist-ok

# TEST_WORKERS: pytest-xdist workers (0: the tests run in pytest's own process; auto: one per core), each taking
# whole test files (their module fixtures, such as a shared engine, stay in one process) in the order
# tests/conftest.py gives them, light layers first (--no-loadscope-reorder: xdist would start the files with the
# most tests first); the files of a ONE_WORKER group there go to one worker, one after the other, after the light
# layers (before the engine's: a long chain of its own, not a tail on one worker at the end). Three by default, on
# two cores as on more: many tests wait on the processes they drive (an editor typing at a person's pace, an engine
# starting), and with two workers the machine stood idle 15% of the run (7% with three); more would add memory
# (each worker starts its own engines and vLLM servers: at least 18 GB of 24 stayed free with three).
TEST_WORKERS ?= 3
test: setup  ## run the whole test suite (unit, protocol, engine, end-to-end); prints the 40 slowest tests
	@$(BIN)/python -m pytest -q -p no:cacheprovider -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder \
	  --durations=40; rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "pytest collected no tests: that is a failure here" >&2; exit 1; fi; exit $$rc

test-editors: setup  ## the real-editor tests CI skips: Neovim 0.12 (ghost text, typing), Helix, VS Code (installs them first)
	command -v tmux >/dev/null || apt-get install -y -q tmux
	bash editors/scripts/setup-sid-editors.sh $(EDITORS)
	bash editors/vscode/scripts/setup-e2e.sh
	DIFFGEMMA_NVIM012=$(abspath $(EDITORS))/nvim012 DIFFGEMMA_HX=$(abspath $(EDITORS))/hx-sid DIFFGEMMA_REQUIRE_VSCODE=1 \
	DIFFGEMMA_REQUIRE_NVIM=1 OMP_NUM_THREADS=1 $(BIN)/python -m pytest -q -p no:cacheprovider -rs \
	  tests/e2e/test_neovim.py tests/e2e/test_neovim_typing.py tests/e2e/test_neovim_readme.py \
	  tests/e2e/test_neovim_next_edit_chain.py tests/e2e/test_neovim_partial_accept.py \
	  tests/e2e/test_helix.py tests/e2e/test_vscode.py tests/e2e/test_vscode_next_edit_chain.py

lint: setup  ## ruff check, ruff format check, then the type checker
	$(BIN)/ruff check . && $(BIN)/ruff format --check .
	@$(MAKE) --no-print-directory typecheck

# mypy finds modules by path and does not run setuptools' import hook, so it sees the folder engine/ under its
# installed name, diffgemma_engine, through a link made here.
TYPECHECK = .cache/typecheck
typecheck: setup  ## mypy, strict, on both packages
	mkdir -p $(TYPECHECK) && ln -sfn $(CURDIR)/engine $(TYPECHECK)/diffgemma_engine
	cd $(TYPECHECK) && MYPYPATH=$(CURDIR) $(abspath $(BIN))/mypy --config-file $(CURDIR)/pyproject.toml \
	  -p diffgemma_lsp -p diffgemma_engine

fix: setup  ## ruff fix and format
	$(BIN)/ruff check --fix . && $(BIN)/ruff format .
