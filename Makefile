# Two commands for a fresh machine, each doing its own set-up:
#   make demo   # train a 4-rank job with one slowed rank and watch laggard name it
#   make test   # the whole test suite (what CI runs), a progress line per test file
#   make test-fast  # the pure packages' tests without the slow (multi-process) ones
#   make test-slow  # only the slow ones: real multi-process jobs, agents, Prometheus, namespaces
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# The only torch this project installs: the CPU wheel available locally on these machines.
# Any other torch specification pulls a multi-gigabyte CUDA build.
TORCH_SPEC ?= torch==2.13.0

.PHONY: venv demo test test-fast test-slow lint bench clean

venv: $(VENV)/.installed

# PYTHONWARNINGS: setuptools warns on every editable install of a package-dir layout that a
# folder named like the package could shadow it; none here is (laggard lives in laggard_pkg/).
$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install -q "$(TORCH_SPEC)" numpy
	echo "$(TORCH_SPEC)" > $(VENV)/constraints.txt
	PYTHONWARNINGS="ignore:Editable installation" \
		$(PY) -m pip install -q -c $(VENV)/constraints.txt -e '.[torch,test,dashboards,dev,report,trainers]'
	touch $@

demo: venv
	$(VENV)/bin/laggard demo $(ARGS)

# A line per test file with its progress, the skips and failures explained at the end, and
# the ten slowest tests. Every wait in the tests has a ceiling scaled by the load average per
# CPU (tests/support.py: budget), pytest-timeout's included: a loaded machine is slower, not red.
PYTEST_REPORT := -rfEs --durations=10

test: venv
	scripts/ensure-prometheus.sh
	$(PY) -m pytest $(PYTEST_REPORT) $(ARGS)

# The pure packages (parsers, detectors, collectors, agent) without the tests marked slow.
FAST_TESTS := tests/parsers tests/detectors tests/collectors tests/agent

test-fast: venv
	$(PY) -m pytest $(PYTEST_REPORT) -m "not slow" $(FAST_TESTS) $(ARGS)

# The training side's modules that mypy checks (the rest reach torch internals mypy cannot type).
MYPY_INTEGRATIONS := $(addprefix integrations/,monitor.py monitor_config.py window_analysis.py window_history.py device_discovery.py \
	step_table.py step_context.py window_gather.py finding_log.py windows_file.py \
	agent_reports.py run_identity.py agent_socket.py heartbeat.py heartbeat_key.py hang_watch.py \
	heartbeat_node.py hang_read.py \
	hang_message.py integrity.py integrity_fingerprints.py integrity_hooks.py \
	integrity_records.py participants.py gpu_state.py host_context.py tracer.py trace_records.py \
	trace_progress.py trace_ops.py trace_sources.py fsdp_trace.py pipeline_trace.py \
	nccl_completion.py flight_recorder_source.py)

test-slow: venv
	scripts/ensure-prometheus.sh
	$(PY) -m pytest $(PYTEST_REPORT) -m slow $(ARGS)

lint: venv
	$(VENV)/bin/ruff check laggard_pkg agent collectors parsers detectors analyze dashboards nvml \
		integrations compression demo tests benchmarks scripts
	$(VENV)/bin/mypy laggard_pkg agent collectors parsers detectors compression nvml \
		integrations/collective_bytes.py $(MYPY_INTEGRATIONS)
	scripts/lint-imports.sh

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache
