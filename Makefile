# Two commands for a fresh machine, each doing its own set-up:
#   make demo   # train a 4-rank job with one slowed rank and watch laggard name it
#   make test   # the whole test suite
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# The only torch this project installs: the CPU wheel available locally on these machines.
# Any other torch specification pulls a multi-gigabyte CUDA build.
TORCH_SPEC ?= torch==2.13.0

.PHONY: venv demo test lint bench clean

venv: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install -q "$(TORCH_SPEC)" numpy
	echo "$(TORCH_SPEC)" > $(VENV)/constraints.txt
	$(PY) -m pip install -q -c $(VENV)/constraints.txt -e '.[torch,test,dashboards,dev,report,trainers]'
	touch $@

demo: venv
	$(VENV)/bin/laggard demo $(ARGS)

test: venv
	scripts/ensure-prometheus.sh
	$(PY) -m pytest -q $(ARGS)

lint: venv
	$(VENV)/bin/ruff check laggard_pkg agent collectors parsers detectors analyze dashboards nvml \
		integrations compression demo tests benchmarks scripts
	$(VENV)/bin/mypy laggard_pkg agent collectors parsers detectors compression nvml \
		integrations/collective_bytes.py integrations/compression
	scripts/lint-imports.sh

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache
