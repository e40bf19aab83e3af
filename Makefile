# `make demo` and `make test` each build the environment from scratch when it is missing, from the
# lock files: exact versions and hashes of every package (requirements.lock, and requirements/torch.lock for
# torch's CPU build; `make lock` writes both). Neither names a path of this machine: pip's own index and
# find-links (its configuration) supply the files, PyTorch's CPU index the torch wheel pip has not at hand.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-stamp
LOCK   := requirements.lock
TORCH_LOCK  := requirements/torch.lock
TORCH_INDEX := https://download.pytorch.org/whl/cpu
export HF_HUB_OFFLINE := 1
export TOKENIZERS_PARALLELISM := false

.PHONY: env demo test test-fast lint test-latest lock bench gpu-check clean

$(STAMP): $(LOCK) $(TORCH_LOCK) pyproject.toml requirements/video-reference.lock
	$(PYTHON) -m venv $(VENV)
	# torch first, its CPU build (never a CUDA one): a wheel pip has at hand (its find-links) is taken without
	# asking any index; only without one is the lock's index asked (PyTorch's CPU index: pip would retry a host
	# it cannot reach for minutes, once for every package, were it named in requirements.lock).
	$(BIN)/pip install --quiet --require-hashes --no-deps --no-index -r $(TORCH_LOCK) 2>/dev/null \
	  || $(BIN)/pip install --quiet --require-hashes --no-deps -r $(TORCH_LOCK)
	# Everything else from the lock, hashes checked, from pip's own index.
	$(BIN)/pip install --quiet --require-hashes --no-deps -r $(LOCK)
	$(BIN)/pip install --quiet --no-deps --no-build-isolation -e .
	$(BIN)/pip check
	# torchvision for the tests' video reference only, in a folder of its own (tests/support/video_reference.py)
	rm -rf $(VENV)/video-reference
	$(BIN)/pip install --quiet --no-deps --require-hashes --target $(VENV)/video-reference -r requirements/video-reference.lock
	touch $(STAMP)

env: $(STAMP)

demo: env
	$(BIN)/python examples/demo.py --workdir build/demo

# pytest-xdist processes (TEST_PROCESSES=1: one process); a test file's tests run in one of them, so a module's
# fixtures are built once. PYTEST_ARGS: more arguments (.ci/run adds --durations).
TEST_PROCESSES ?= 2
PYTEST := $(BIN)/python -m pytest -q -p no:cacheprovider $(if $(filter-out 1,$(TEST_PROCESSES)),-n $(TEST_PROCESSES) --dist loadfile,-p no:xdist)

test: env
	$(PYTEST) $(PYTEST_ARGS)

# The inner loop: everything but the integration tier (torchrun, Ray, servers, model families; tests/conftest.py).
test-fast: env
	$(PYTEST) -m "not integration" $(PYTEST_ARGS)

# Static checks (pyproject.toml configures each): ruff's rule set, mypy on the package, the import-linter
# contracts (DESIGN.md section 7). PYTHONPATH=. : the layers are read from this checkout, wherever the venv points.
lint: env
	$(BIN)/ruff check wdspack tools examples tests
	$(BIN)/mypy
	PYTHONPATH=. $(BIN)/lint-imports

# Re-resolve the lock from pyproject.toml's ranges for this machine's Python and platform (pins already in the
# lock that still fit are kept; delete a line to move it on; run the suite after). pip-compile resolves against
# torch's CPU wheel for this machine (pip's at hand, else PyTorch's CPU index's), writes no index or find-links
# line, and tools/lock.py moves torch into requirements/torch.lock with its CPU wheels' hashes (docs/development.md).
lock:
	$(PYTHON) -m venv build/piptools && build/piptools/bin/pip install --quiet pip-tools==7.7.0
	rm -rf build/torch-wheel
	build/piptools/bin/pip download --quiet --no-deps -d build/torch-wheel --no-index \
	    -r requirements/torch-cpu.txt 2>/dev/null \
	  || build/piptools/bin/pip download --quiet --no-deps -d build/torch-wheel --extra-index-url $(TORCH_INDEX) \
	    -r requirements/torch-cpu.txt
	CUSTOM_COMPILE_COMMAND="make lock" build/piptools/bin/pip-compile --quiet --generate-hashes --allow-unsafe \
	  --strip-extras --no-emit-options --find-links build/torch-wheel --extra dev \
	  --extra plot --extra models --extra lint --extra docs -c requirements/torch-cpu.txt -o $(LOCK) pyproject.toml
	build/piptools/bin/python -m tools.lock $(LOCK) --torch-lock $(TORCH_LOCK) --wheels build/torch-wheel \
	  --torch-index $(TORCH_INDEX)

# The suite on the newest releases pyproject.toml admits (not in CI: it tells what the next lock will meet).
test-latest:
	$(PYTHON) -m venv build/venv-latest
	build/venv-latest/bin/pip install --quiet torch==2.13.0
	build/venv-latest/bin/pip install --quiet --upgrade --upgrade-strategy eager -e '.[dev,plot,models]'
	build/venv-latest/bin/pip list 2>/dev/null | grep -iE '^(transformers|tokenizers|huggingface.hub|torch) '
	build/venv-latest/bin/python -m pytest -q -p no:cacheprovider

bench: env
	$(BIN)/python -m tools.bench_packing
	$(BIN)/python -m tools.bench_loader --json docs/benchmarks/data/bench_loader.json
	$(BIN)/python -m tools.bench_processor --json docs/benchmarks/data/bench_processor.json
	$(BIN)/python -m tools.bench_train --records 120 --json docs/benchmarks/data/bench_train.json
	$(BIN)/python -m tools.bench_balance --json docs/benchmarks/data/bench_balance.json --plot docs/balance.png
	$(BIN)/python -m tools.bench_mixture_balance --json docs/benchmarks/data/bench_mixture_balance.json
	$(BIN)/python -W ignore -m tools.bench_wds --json docs/benchmarks/data/bench_wds.json
	$(BIN)/python -m tools.bench_sources --json docs/benchmarks/data/bench_sources.json
	$(BIN)/python -m tools.bench_mixture --json docs/benchmarks/data/bench_mixture.json
	$(BIN)/python -m tools.bench_mixture_loader --json docs/benchmarks/data/bench_mixture_loader.json
	$(BIN)/python -m tools.bench_pack_speed --json docs/benchmarks/data/bench_pack_speed.json
	$(BIN)/python -m tools.bench_video --json docs/benchmarks/data/bench_video.json
	$(BIN)/python -m tools.bench_audio --json docs/benchmarks/data/bench_audio.json

# On a CUDA machine (not in CI): the gpu-marked tests, the loader at the host's cores and bench_train at
# issue 24's size, then a summary. No venv:
# the machine's own CUDA torch (docs/guides/train.md#on-a-gpu); run with PYTHONPATH set as the guide says.
gpu-check:
	$(PYTHON) -m tools.gpu_check

# The documentation site (mkdocs.yml, docs/) into build/site. --strict: any warning fails the build (a broken
# link or anchor, a name of wdspack.__all__ without its API entry); the CLI and API pages are generated.
.PHONY: docs
docs: env
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict -d build/site

clean:
	rm -rf $(VENV) build .pytest_cache
