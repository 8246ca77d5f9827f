# qveil: `make demo` and `make test` work from a fresh clone (they create .venv/ first).
SHELL := /bin/bash
PYTHON ?= python3.11
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
STAMP := $(VENV)/.qveil-installed

.PHONY: setup demo test test-fast check proto proto-check bench reliability wheels clean

setup: $(STAMP)

# torch first and pinned: the CPU wheel on this machine; any other spec pulls GBs of CUDA.
$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade "pip>=24"
	$(PIP) install -q torch==2.13.0
	$(PIP) install -q -e '.[server,trainer,dev]'
	# the editable sources' bytecode, once: a process started with PYTHONDONTWRITEBYTECODE set
	# (as here and in CI) then reads it instead of compiling every qveil module it imports
	$(PY) -m compileall -q core server trainer client common experiments proto >/dev/null
	touch $(STAMP)

demo: setup
	bash scripts/demo.sh

# The suite on every core (pytest-xdist): TEST_WORKERS=0 runs it in this one process.
TEST_WORKERS ?= auto
test: setup
	$(PY) -m pytest -q -p no:cacheprovider -n $(TEST_WORKERS) --dist loadgroup $(PYTEST_ARGS)

check: setup proto-check
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	# strict mypy over every part of the namespace ([tool.mypy] files), and the layers'
	# contracts over `qveil` as the editable install's .pth puts it on the path
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports
	# no import cycle between qveil modules, and a reason beside every import inside a function
	$(PY) -m pytest -q -p no:cacheprovider tests/unit/test_import_graph.py

# Regenerate the committed gRPC/protobuf stubs (never edit them by hand).
proto: setup
	bash scripts/gen_proto.sh

# Fails when the committed stubs differ from what the .proto files generate.
proto-check: setup
	bash scripts/gen_proto.sh --check

bench: setup
	for f in benchmarks/bench_*.py; do $(PY) $$f || exit 1; done

# Full reliability suite: >= 50 kills, replicas, 2-minute soak, faults; writes docs/reliability.md.
reliability: setup
	bash scripts/reliability.sh

# Every wheel the two images of deploy/Dockerfile install (qveil's own, torch==2.13.0 as pip
# resolves it here: the CPU wheel, and the server's and trainer's dependencies), resolved in
# one go so that they fit together; `docker build` then installs from it with --no-index.
WHEELHOUSE := dist/wheelhouse
wheels: setup
	rm -rf $(WHEELHOUSE)
	mkdir -p $(WHEELHOUSE)
	$(PIP) wheel -q --wheel-dir $(WHEELHOUSE) torch==2.13.0 '.[server,trainer]'
	ls $(WHEELHOUSE) | wc -l | xargs echo "wheels in $(WHEELHOUSE):"

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache build dist *.egg-info client/build client/*.egg-info demo-out
