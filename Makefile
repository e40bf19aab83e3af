# `make demo` and `make test` each build the environment from scratch when it is missing.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-stamp
export HF_HUB_OFFLINE := 1
export TOKENIZERS_PARALLELISM := false

.PHONY: env demo test bench clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	# The CPU build of torch first: a bare `torch` requirement would pull a multi-GB CUDA build.
	$(BIN)/pip install --quiet torch==2.13.0
	$(BIN)/pip install --quiet -e '.[dev,plot]'
	touch $(STAMP)

env: $(STAMP)

demo: env
	$(BIN)/python examples/demo.py --workdir build/demo

test: env
	$(BIN)/python -m pytest -q -p no:cacheprovider

bench: env
	$(BIN)/python tools/bench_packing.py
	$(BIN)/python tools/bench_loader.py --json docs/bench_loader.json
	$(BIN)/python tools/bench_processor.py --json docs/bench_processor.json
	$(BIN)/python tools/bench_train.py --records 120 --json docs/bench_train.json
	$(BIN)/python tools/bench_balance.py --json docs/bench_balance.json --plot docs/balance.png
	$(BIN)/python -W ignore tools/bench_wds.py --json docs/bench_wds.json
	$(BIN)/python tools/bench_sources.py --json docs/bench_sources.json

clean:
	rm -rf $(VENV) build .pytest_cache
