# The commands of the README. Each sets everything up on a fresh machine.
.PHONY: demo test test-fast venv lint

VENV ?= .venv

venv: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	scripts/install.sh $(VENV)
	touch $@

# The demo's port: `make demo PORT=9000` (or RESERVO_HTTP_PORT=9000 make demo); 8000 unset.
PORT ?= $(RESERVO_HTTP_PORT)

demo: venv
	$(VENV)/bin/reservo up --demo $(if $(PORT),--port $(PORT))

test: venv
	scripts/test.sh

# The unit tests alone: no database, Redis or process, seconds (the whole suite: `make test`).
test-fast: venv
	$(VENV)/bin/pytest tests/unit -q -p no:cacheprovider

lint: venv
	$(VENV)/bin/ruff check src tests bench
	$(VENV)/bin/lint-imports
