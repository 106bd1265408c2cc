# The two commands (see README): `make demo` and `make test`. Both set up what they need.
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.vlmdata-env-stamp

.PHONY: demo test env bench lint clean

$(STAMP): pyproject.toml tools/setup_env.sh
	bash tools/setup_env.sh $(VENV)
	touch $(STAMP)

env: $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/vlmdata demo

test: $(STAMP)
	bash tools/run_tests.sh $(VENV)

lint: $(STAMP)
	$(VENV)/bin/ruff check vlmdata vlmdata_pipelines tools tests

clean:
	rm -rf $(VENV) .pytest_cache build *.egg-info
