# Two commands do all set-up on a fresh machine: `make run` and `make test`.
PYTHON ?= python3
VENV ?= .venv
# Default: the CPU build from PyTorch's CPU index on a machine without an NVIDIA GPU (PyPI's when that index cannot
# be reached), the default index's CUDA build where there is a GPU. Override, e.g. TORCH_INDEX_URL=https://download.pytorch.org/whl/cu128
# (only the torch install uses that index; everything else still comes from PyPI)
TORCH_SPEC ?= torch==2.13.0
TORCH_INDEX_URL ?=
EXTRAS ?= dev,notebook,spark,ray,tensorboard,tune,compress,hf,streaming,tracking,docs
NP ?= 2
ARGS ?=
# The stamp names the torch build and extras asked for: changing TORCH_SPEC, TORCH_INDEX_URL or EXTRAS re-runs set-up
# (which then switches a CPU torch for a CUDA one or back, and builds the Horovod that goes with it).
SETUP_KEY := $(shell printf '%s|%s|%s' '$(TORCH_SPEC)' '$(TORCH_INDEX_URL)' '$(EXTRAS)' | cksum | cut -d' ' -f1)
STAMP := $(VENV)/.hvdtrain-setup-ok-$(SETUP_KEY)
BIN := $(VENV)/bin

.PHONY: setup run test test-all test-fast lint doctor gpu-check bench docs clean docker-cpu docker-gpu

setup: $(STAMP)

$(STAMP): setup.cfg pyproject.toml scripts/install_horovod.py $(wildcard scripts/horovod/*.py scripts/horovod/patches/*) scripts/choose_torch.py scripts/setup-env scripts/install-horovod
	PYTHON='$(PYTHON)' VENV='$(VENV)' TORCH_SPEC='$(TORCH_SPEC)' TORCH_INDEX_URL='$(TORCH_INDEX_URL)' EXTRAS='$(EXTRAS)' STAMP='$(STAMP)' bash scripts/setup-env

# The main job: the default config (the CNN on scikit-learn's bundled digits) on NP local workers.
run: setup
	$(BIN)/horovodrun -np $(NP) -H localhost:$(NP) $(BIN)/python -m hvdtrain $(ARGS)

# Two pytest-xdist workers run the test files at once, each file one group and the cluster tier one group, one test
# after another (tests/conftest.py's scheduler; docs/testing.md). TEST_WORKERS=0: one process.
TEST_WORKERS ?= 2
PARALLEL := -n $(TEST_WORKERS) --dist loadgroup

# The default run (what .ci/run calls): every tier without the long forms (docs/testing.md); test-all adds them.
test: setup
	$(BIN)/python -m pytest -m "not long" $(PARALLEL) $(ARGS)

test-all: setup
	$(BIN)/python -m pytest $(PARALLEL) $(ARGS)

# Unit tests and one-worker tests only (a few minutes): the tiers in tests/unit and tests/one_rank.
test-fast: setup
	$(BIN)/python -m pytest tests/unit tests/one_rank $(PARALLEL) $(ARGS)

# Benchmarks (benchmarks/README.md): hvdtrain vs hand-written Horovod vs DDP vs one process, A B A B.
# make bench ARGS=--smoke for the CI size; results in bench-results/.
bench: setup
	$(BIN)/python -m benchmarks.run $(ARGS)

lint: setup
	$(BIN)/ruff check hvdtrain tests examples benchmarks docker docs
	$(BIN)/mypy
	@# Every test module imports: a helper renamed in one test file fails here, not mid-suite.
	@out=$$($(BIN)/python -m pytest --collect-only -q -p no:cacheprovider tests 2>&1) || { echo "$$out" | tail -60; exit 1; }

doctor: setup
	$(BIN)/hvdtrain doctor

# Every GPU path once (needs GPUs and a CUDA torch; elsewhere it exits at once: "no CUDA device").
gpu-check: setup
	$(BIN)/hvdtrain doctor --gpu

# The docs site (docs/, MyST Markdown): warnings are errors, -n reports every broken reference and anchor,
# docs/_ext/hvdtrain_docs.py checks every flag the pages name. Open docs/_build/html/index.html.
docs: setup
	$(BIN)/python -m sphinx -b html -W --keep-going -n -q docs docs/_build/html

# Container images (docker/README.md): docker when its daemon answers, else podman (ENGINE=... to choose).
# The CPU build reuses the host's torch and cached Horovod wheels; extra args e.g.
# DOCKER_BUILD_ARGS='--build-arg CUDA_CC_LIST=90' or '--offline-base'.
DOCKER_BUILD_ARGS ?=
docker-cpu:
	$(PYTHON) docker/build.py cpu $(DOCKER_BUILD_ARGS)

docker-gpu:
	$(PYTHON) docker/build.py gpu $(DOCKER_BUILD_ARGS)

clean:
	rm -rf $(VENV) runs bench-results docs/_build .pytest_cache .mypy_cache .ruff_cache docker/cache/torch docker/cache/hvdtrain
