# dpmarket: `make demo` and `make test` work on a machine with only Python 3.11 installed.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-stamp

.PHONY: demo evaluate test check lint typecheck unit unit-fast unit-ray bench-quick clean

$(STAMP): pyproject.toml
	$(PYTHON) -c 'import sys; sys.exit(sys.version_info < (3, 11))' || \
	  { echo "dpmarket needs Python >= 3.11 (found $(PYTHON))"; exit 1; }
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[market,test,dev]'
	touch $(STAMP)

demo: $(STAMP)
	rm -rf out/demo
	$(BIN)/dpmarket run configs/rare-target.toml --out out/demo

evaluate: $(STAMP)
	$(BIN)/dpmarket digits --config configs/evaluate.toml

test: $(STAMP) lint typecheck unit

# the inner loop: lint, types and every test that starts no Ray (benchmarks/RESULTS.md, "Test
# suite time (issue 37)")
check: $(STAMP) lint typecheck unit-fast

# each part prints its slowest tests; benchmarks/RESULTS.md records the times per part
# (benchmarks/suite_time.py). Each part runs in JOBS pytest-xdist workers, a test file per
# worker at a time (module fixtures and the worker's shared local Ray are set up once per
# file); JOBS=1 runs a part in one process, JOBS=auto one worker per core.
JOBS ?= 2
# the Ray part's workers (3 measured slower and flakier than 2: benchmarks/RESULTS.md)
RAY_JOBS ?= $(JOBS)
PYTEST := $(BIN)/python -m pytest -q --durations=25 --dist loadfile

# two pytest runs at the same time: the Ray tests (local Ray instances, market runs, which
# wait on processes and deadlines as much as they compute) and the rest (CPU-bound), so each
# fills the other's idle time; one process for all of them grew past the machine's memory
# (what Ray and the runs leave behind in the pytest process accumulated under the later
# tests). Their output is interleaved by whole lines; each prints its own summary. The sketch
# kernels are compiled first, once (numba's cache), not by each owner process of both parts.
unit: $(STAMP)
	$(BIN)/python -c "from dpmarket.actors.parties.owner import warm_kernels; warm_kernels()"
	$(MAKE) --no-print-directory -j2 --output-sync=line unit-fast unit-ray

unit-fast: $(STAMP)
	$(PYTEST) -n $(JOBS) -m "not ray"

unit-ray: $(STAMP)
	$(PYTEST) -n $(RAY_JOBS) -m ray

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

# mypy --strict over the packages as installed names (dpmarket, dpmarket.protocol, ...): a
# tree of symlinks gives mypy the layout the editable install maps at run time (the top-level
# API's files, api/, beside the three folders mapped into it).
typecheck: $(STAMP)
	rm -rf .typecheck && mkdir -p .typecheck/dpmarket
	ln -s ../../api/__init__.py ../../api/api.py ../../api/py.typed .typecheck/dpmarket/
	ln -s ../../protocol .typecheck/dpmarket/protocol
	ln -s ../../streams .typecheck/dpmarket/streams
	ln -s ../../actors .typecheck/dpmarket/actors
	cd .typecheck && ../$(BIN)/mypy --strict --config-file ../pyproject.toml -p dpmarket

bench-quick: $(STAMP)
	$(BIN)/python benchmarks/utility_digits.py --quick

clean:
	rm -rf $(VENV) .typecheck .pytest_cache .mypy_cache .ruff_cache
