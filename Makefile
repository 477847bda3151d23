# Two commands do all set-up on a fresh machine: `make run` and `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: run test bench install migrate clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e ".[test]"
	touch $(STAMP)

install: $(STAMP)

migrate: install
	$(BIN)/python manage.py migrate --noinput
	$(BIN)/python manage.py seed_demo

# Starts web (uvicorn), Celery worker and Celery beat from the Procfile.
# With nothing set: SQLite under var/ and a filesystem broker, no server needed.
run: migrate
	@echo "==> Marketplace on http://127.0.0.1:$${PORT:-8000}/  (API docs: /api/docs/, admin: /admin/)"
	$(BIN)/honcho start -f Procfile

test: install
	@eval "$$(scripts/test-env.sh)"; \
	  echo "==> tests on $${DATABASE_URL:-SQLite} (e2e broker: $${TEST_REDIS_URL:-none})"; \
	  $(BIN)/python -m pytest $(PYTEST_ARGS)

bench: install
	@eval "$$(scripts/test-env.sh)"; $(BIN)/python -m bench

clean:
	rm -rf var
