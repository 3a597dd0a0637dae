# The two commands of the README. Both set everything up on a fresh machine.
.PHONY: demo test venv lint

VENV ?= .venv

venv: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	scripts/install.sh $(VENV)
	touch $@

demo: venv
	$(VENV)/bin/reservo up --demo

test: venv
	scripts/test.sh

lint: venv
	$(VENV)/bin/ruff check src tests bench
	$(VENV)/bin/lint-imports
