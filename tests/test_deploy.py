"""The production profile: `check --deploy` passes with the documented environment;
a malformed or missing production setting stops start-up."""

import os
import secrets
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

PRODUCTION = {
    "DEBUG": "false",
    "ALLOWED_HOSTS": "gpu.example.com",
    "CSRF_TRUSTED_ORIGINS": "https://gpu.example.com",
    "SECURE_SSL_REDIRECT": "true",
    "SECURE_HSTS_SECONDS": "31536000",
    "SECURE_HSTS_INCLUDE_SUBDOMAINS": "true",
    "SECURE_HSTS_PRELOAD": "true",
}


def manage(*args: str, **env: str) -> subprocess.CompletedProcess:
    full = {k: v for k, v in os.environ.items() if not k.startswith("SECURE_")}
    full.update(env)
    return subprocess.run([sys.executable, "manage.py", *args], cwd=ROOT, env=full, capture_output=True, text=True)


def test_check_deploy_passes_with_the_documented_production_environment():
    result = manage("check", "--deploy", "--fail-level", "WARNING", SECRET_KEY=secrets.token_urlsafe(60), **PRODUCTION)
    assert result.returncode == 0, result.stderr + result.stdout
    assert "no issues" in result.stdout


def test_production_without_a_secret_key_refuses_to_start():
    result = manage("check", SECRET_KEY="dev-only-insecure-key-change-me-in-production-0123456789", **PRODUCTION)
    assert result.returncode != 0 and "SECRET_KEY must be set" in result.stderr


def test_a_malformed_setting_fails_loudly_at_start():
    result = manage("check", DRAIN_CEILING_S="soon")
    assert result.returncode != 0 and "DRAIN_CEILING_S='soon' is not a number" in result.stderr
