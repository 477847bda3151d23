#!/usr/bin/env bash
# Prints the DATABASE_URL and REDIS_URL the test suite should use, as shell
# assignments. An explicit environment wins; otherwise the local PostgreSQL
# and Redis if they answer, else SQLite (and PostgreSQL-only tests are listed
# as not run).
set -u
if [ -z "${DATABASE_URL:-}" ]; then
  if (exec 3<>/dev/tcp/127.0.0.1/5432) 2>/dev/null; then
    DATABASE_URL="postgres://postgres@127.0.0.1:5432/marketplace"
  else
    echo "!!! PostgreSQL not reachable on 127.0.0.1:5432: testing on SQLite; PostgreSQL-only tests will NOT run" >&2
    DATABASE_URL=""
  fi
fi
if [ -z "${TEST_REDIS_URL:-}" ]; then
  if (exec 3<>/dev/tcp/127.0.0.1/6379) 2>/dev/null; then
    TEST_REDIS_URL="redis://127.0.0.1:6379/15"
  else
    echo "!!! Redis not reachable on 127.0.0.1:6379: end-to-end tests will NOT run" >&2
    TEST_REDIS_URL=""
  fi
fi
echo "export DATABASE_URL='${DATABASE_URL}' TEST_REDIS_URL='${TEST_REDIS_URL}'"
