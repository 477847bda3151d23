# Two commands do all set-up on a fresh machine: `make run` and `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: run test bench soak install migrate clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e ".[test]"
	touch $(STAMP)

install: $(STAMP)

migrate: install
	$(BIN)/python manage.py migrate --noinput
	$(BIN)/python manage.py seed_demo

# Starts web (uvicorn), Celery worker and beat, and the demo fleet (agents and
# traffic) from the Procfile. With nothing set: SQLite under var/ and a
# filesystem broker, no server needed. Ctrl-C stops every process.
run: migrate
	@rm -rf $${VAR_DIR:-var}/prometheus && mkdir -p $${VAR_DIR:-var}/prometheus
	@echo ""
	@echo "==> Marketplace on http://127.0.0.1:$${MARKETPLACE_PORT:-8000}/   (API docs /api/docs/, admin /admin/, metrics /metrics)"
	@echo "    Try: log in as owner / owner-pass-123, open My nodes, Pause spot-node-1 and watch it drain;"
	@echo "         log in as renter / renter-pass-123 to rent a node and read its reclaim notice."
	@echo ""
	PROMETHEUS_MULTIPROC_DIR=$${VAR_DIR:-var}/prometheus $(BIN)/honcho start -f Procfile

test: install
	@eval "$$(scripts/test-env.sh)"; \
	  echo "==> tests on $${DATABASE_URL:-SQLite} (e2e broker: $${TEST_REDIS_URL:-none})"; \
	  $(BIN)/python -m pytest $(PYTEST_ARGS)

# Runs every benchmark in bench/ on PostgreSQL and Redis, prints the figures
# and writes BENCHMARKS.md: each headline figure with its target, the machine
# and the date (BENCH_REPORT=path writes it elsewhere).
bench: install
	@command -v wrk >/dev/null || { echo "==> installing wrk from Debian's packages (the HTTP load generator)"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq wrk >/dev/null; }
	@eval "$$(scripts/test-env.sh)"; $(BIN)/python -m bench

# The soak, outside the normal suite (about 10 minutes plus a few of set-up):
# 2,000 simulated nodes heartbeating, 100 concurrent streams, owners pausing and
# resuming at random; prints drains, requests, cuts, leaked slots, false lost
# workers and each process's memory, and fails if an invariant broke.
# SOAK_NODES, SOAK_STREAMS, SOAK_MINUTES scale it.
soak: install
	@eval "$$(scripts/test-env.sh)"; $(BIN)/python -m bench.soak

clean:
	rm -rf var
