"""Settings, all read from the environment with defaults that run locally.

With nothing set: SQLite under var/ and kombu's filesystem broker, so `make run`
needs no server. DATABASE_URL (PostgreSQL) and CELERY_BROKER_URL (Redis) switch
to the production parts.
"""

from datetime import timedelta
from pathlib import Path

import dj_database_url
from django.core.exceptions import ImproperlyConfigured
from django.core.exceptions import ImproperlyConfigured

from marketplace.env import env_bool, env_float, env_int, env_list, env_str

BASE_DIR = Path(__file__).resolve().parent.parent
VAR_DIR = Path(env_str("VAR_DIR", str(BASE_DIR / "var")))
VAR_DIR.mkdir(parents=True, exist_ok=True)

DEBUG = env_bool("DEBUG", True)
SECRET_KEY = env_str("SECRET_KEY", "dev-only-insecure-key-change-me-in-production-0123456789")
ALLOWED_HOSTS = env_list("ALLOWED_HOSTS", ["localhost", "127.0.0.1", "[::1]", "testserver"])
CSRF_TRUSTED_ORIGINS = env_list("CSRF_TRUSTED_ORIGINS", [])

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "rest_framework.authtoken",
    "drf_spectacular",
    "django_htmx",
    "marketplace",
    "nodes",
    "rentals",
    "inference",
    "reputation",
    "preemption",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "django_htmx.middleware.HtmxMiddleware",
]

ROOT_URLCONF = "marketplace.urls"
WSGI_APPLICATION = "marketplace.wsgi.application"
ASGI_APPLICATION = "marketplace.asgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

DATABASES = {
    "default": dj_database_url.parse(
        env_str("DATABASE_URL", f"sqlite:///{VAR_DIR / 'db.sqlite3'}"),
        conn_max_age=env_int("DB_CONN_MAX_AGE", 60),
        conn_health_checks=True,
    )
}
DB_POOL_MAX = env_int("DB_POOL_MAX", 8)
# Django requests one web process runs at once; the rest wait their turn in the
# event loop (marketplace/gate.py). Under ASGI each Django request gets a thread
# of its own, so a burst (2,000 agents saying hello after an outage) would start
# 2,000 threads fighting over DB_POOL_MAX connections, failing with PoolTimeout
# after DB_POOL_TIMEOUT_S. The router and the heartbeat fast path are not gated.
DJANGO_CONCURRENCY = env_int("DJANGO_CONCURRENCY", DB_POOL_MAX)
if DATABASES["default"]["ENGINE"] == "django.db.backends.postgresql" and env_bool("DB_POOL", True):
    # Under ASGI every sync request runs in a new thread, so CONN_MAX_AGE
    # connections are never reused and pile up; a pool per process is reused.
    DATABASES["default"]["CONN_MAX_AGE"] = 0
    DATABASES["default"]["CONN_HEALTH_CHECKS"] = False
    DATABASES["default"]["OPTIONS"] = {
        "pool": {"min_size": 1, "max_size": DB_POOL_MAX, "timeout": env_float("DB_POOL_TIMEOUT_S", 10.0)}
    }
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    # Several processes (web, worker, beat) share one file: wait for the write
    # lock instead of failing, and take it at BEGIN so a read-then-write never
    # deadlocks on lock upgrade.
    DATABASES["default"]["OPTIONS"] = {
        "timeout": 20,
        "transaction_mode": "IMMEDIATE",
        "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
    }
    # A file, not Django's shared in-memory database: tests that run the router's
    # threads next to the test's own need SQLite's real locking and busy timeout.
    DATABASES["default"]["TEST"] = {"NAME": str(VAR_DIR / "test-db.sqlite3")}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
]

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
STATIC_ROOT = VAR_DIR / "static"
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "whitenoise.storage.CompressedStaticFilesStorage"},
}
# Tests and a fresh checkout render pages before collectstatic has run.
WHITENOISE_USE_FINDERS = DEBUG
WHITENOISE_AUTOREFRESH = DEBUG
# The portal's own stylesheet and script (static/), next to the apps' static files.
STATICFILES_DIRS = [BASE_DIR / "static"]
LOGIN_URL = "/accounts/login/"
LOGIN_REDIRECT_URL = "/nodes/"
LOGOUT_REDIRECT_URL = "/"

REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "rest_framework.authentication.TokenAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "EXCEPTION_HANDLER": "marketplace.api_errors.exception_handler",
    "DEFAULT_RENDERER_CLASSES": ["rest_framework.renderers.JSONRenderer"],
    "DEFAULT_PARSER_CLASSES": ["rest_framework.parsers.JSONParser"],
    "DEFAULT_PAGINATION_CLASS": None,
    "COERCE_DECIMAL_TO_STRING": False,
    # The client address for per-IP limits: REMOTE_ADDR, or the address this many
    # proxies back in X-Forwarded-For (never the whole header: a client could vary it).
    "NUM_PROXIES": env_int("NUM_PROXIES", 0),
}
if DEBUG:
    REST_FRAMEWORK["DEFAULT_RENDERER_CLASSES"].append("rest_framework.renderers.BrowsableAPIRenderer")

# --- Cache and rate limits ------------------------------------------------------
# Throttle counters live in the cache: Redis shared by every web process when
# CACHE_URL (or REDIS_URL) is set, else local memory (per process).
CACHE_URL = env_str("CACHE_URL", "") or env_str("REDIS_URL", "")
if CACHE_URL:
    CACHES = {"default": {"BACKEND": "django.core.cache.backends.redis.RedisCache", "LOCATION": CACHE_URL}}
else:
    CACHES = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache", "LOCATION": "marketplace"}}
# "<n>/<s|min|hour|day>"; empty turns a limit off. None of them guards a safety rule
# (README, Operations): the agent heartbeat, which delivers stop commands, has none.
THROTTLE_LOGIN_RATE = env_str("THROTTLE_LOGIN_RATE", "10/min")  # per client IP and username
THROTTLE_AGENT_RATE = env_str("THROTTLE_AGENT_RATE", "600/min")  # per agent token: hello, workers, acks, notices
THROTTLE_WEBHOOK_RATE = env_str("THROTTLE_WEBHOOK_RATE", "6000/min")  # per sender IP, signed requests
for _name in ("THROTTLE_LOGIN_RATE", "THROTTLE_AGENT_RATE", "THROTTLE_WEBHOOK_RATE"):
    _rate = globals()[_name]
    if _rate:
        _n, _, _period = _rate.partition("/")
        if not _n.isdigit() or not _period or _period[0] not in "smhd":
            raise ImproperlyConfigured(f"{_name}={_rate!r}: use <n>/<s|min|hour|day>, or empty for none")

SPECTACULAR_SETTINGS = {
    "TITLE": "GPU marketplace API",
    "DESCRIPTION": "Providers, renters, node agents and cloud preemption notices. See API.md.",
    "VERSION": "1",
    "SERVE_INCLUDE_SCHEMA": False,
    "COMPONENT_SPLIT_REQUEST": True,
}

# --- Celery -----------------------------------------------------------------
BROKER_DIR = VAR_DIR / "broker"
CELERY_BROKER_URL = env_str("CELERY_BROKER_URL", "filesystem://")
if CELERY_BROKER_URL.startswith("filesystem://"):
    for sub in ("queue", "processed"):
        (BROKER_DIR / sub).mkdir(parents=True, exist_ok=True)
    CELERY_BROKER_TRANSPORT_OPTIONS = {
        "data_folder_in": str(BROKER_DIR / "queue"),
        "data_folder_out": str(BROKER_DIR / "queue"),
        "processed_folder": str(BROKER_DIR / "processed"),
        "store_processed": False,
    }
else:
    CELERY_BROKER_TRANSPORT_OPTIONS = {}
    if CELERY_BROKER_URL.split("://", 1)[0] in ("redis", "rediss"):
        # kombu's Redis transport plus one guard (marketplace/broker.py): without it the
        # worker process can exit during a Redis outage instead of reconnecting (issue #8).
        CELERY_BROKER_TRANSPORT = "marketplace.broker:Transport"
CELERY_TASK_IGNORE_RESULT = True
CELERY_RESULT_BACKEND = None
CELERY_TASK_ALWAYS_EAGER = env_bool("CELERY_TASK_ALWAYS_EAGER", False)
CELERY_TASK_ACKS_LATE = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 4
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
# A worker that lost the broker retries for as long as it takes (every 2, 4, ... 30 s), then
# resumes consuming; Celery's default gives up after 100 tries (~45 min) and exits.
CELERY_BROKER_CONNECTION_MAX_RETRIES = None
# An enqueue after a commit must not hold the request while the broker is away:
# try briefly, then leave the follow-up to the periodic job that covers it.
CELERY_TASK_PUBLISH_RETRY_POLICY = {"max_retries": 1, "interval_start": 0, "interval_step": 0.2, "interval_max": 0.2}
CELERY_BEAT_SCHEDULE_FILENAME = str(VAR_DIR / "celerybeat-schedule")

# --- The reclaim promise and its clocks (seconds) -----------------------------
DRAIN_CEILING_S = env_float("DRAIN_CEILING_S", 120.0)
RENTAL_NOTICE_S = env_float("RENTAL_NOTICE_S", 120.0)
NOTICE_MARGIN_S = env_float("NOTICE_MARGIN_S", 10.0)
HEARTBEAT_INTERVAL_S = env_float("HEARTBEAT_INTERVAL_S", 5.0)
WORKER_EXPIRY_S = env_float("WORKER_EXPIRY_S", 30.0)
NODE_OFFLINE_S = env_float("NODE_OFFLINE_S", 30.0)
ROUTER_EXPIRY_S = env_float("ROUTER_EXPIRY_S", 15.0)
STOP_GRACE_S = env_float("STOP_GRACE_S", 5.0)
STOP_RESEND_S = env_float("STOP_RESEND_S", 15.0)
DRAIN_TICK_S = env_float("DRAIN_TICK_S", 1.0)
HEARTBEAT_GUARD_S = env_float("HEARTBEAT_GUARD_S", 5.0)
RECOVERY_S = env_float("RECOVERY_S", 15.0)
# More than this share of the fleet going stale at once is our own network, not
# the nodes: the guard alerts and waits instead of marking everyone lost.
MASS_STALE_FRACTION = env_float("MASS_STALE_FRACTION", 0.5)
MASS_STALE_MIN_WORKERS = env_int("MASS_STALE_MIN_WORKERS", 4)

# --- Router --------------------------------------------------------------------
ROUTER_STORE = env_str("ROUTER_STORE", "auto")  # auto: pg on PostgreSQL, else orm
ROUTER_DB_POOL = env_int("ROUTER_DB_POOL", 16)
ROUTER_RETRIES = env_int("ROUTER_RETRIES", 2)
ROUTER_CONNECT_TIMEOUT_S = env_float("ROUTER_CONNECT_TIMEOUT_S", 2.0)
ROUTER_CUT_POLL_S = env_float("ROUTER_CUT_POLL_S", 0.25)
ROUTER_LOG_FLUSH_S = env_float("ROUTER_LOG_FLUSH_S", 0.25)
ROUTER_KEY_CACHE_S = env_float("ROUTER_KEY_CACHE_S", 10.0)
ROUTER_MODEL_CACHE_S = env_float("ROUTER_MODEL_CACHE_S", 5.0)
# Fault-injection headers reach the fake model server only when this is on (demo, tests).
ROUTER_PASS_SIM_HEADERS = env_bool("ROUTER_PASS_SIM_HEADERS", DEBUG)
# Generation on a spot worker must fit in the notice window at the model's typical speed.
SPOT_GENERATION_WINDOW_S = env_float("SPOT_GENERATION_WINDOW_S", 120.0)
AGENT_FASTPATH_POOL = env_int("AGENT_FASTPATH_POOL", 8)
REQUEST_LOG_RETENTION_DAYS = env_float("REQUEST_LOG_RETENTION_DAYS", 7.0)

# --- Reputation (R11) -------------------------------------------------------------
# Beta prior: a new provider starts at 9/10 and one early failure costs little.
REPUTATION_PRIOR_SUCCESSES = env_float("REPUTATION_PRIOR_SUCCESSES", 9.0)
REPUTATION_PRIOR_FAILURES = env_float("REPUTATION_PRIOR_FAILURES", 1.0)
REPUTATION_WINDOW_DAYS = env_float("REPUTATION_WINDOW_DAYS", 90.0)
REPUTATION_DELIST_BELOW = env_float("REPUTATION_DELIST_BELOW", 0.6)
REPUTATION_DELIST_MIN_RENTALS = env_int("REPUTATION_DELIST_MIN_RENTALS", 5)

# --- Cloud preemption notices (R12) ------------------------------------------------
# shadow by default: a new deployment records what it would do with real notices
# (matching by instance id, predicted drains) before staff let a cloud drain nodes,
# per cloud, in the admin (PreemptionPolicy), no deploy needed.
PREEMPTION_MODE = env_str("PREEMPTION_MODE", "shadow").strip().lower()
if PREEMPTION_MODE not in ("off", "shadow", "prod"):
    raise ImproperlyConfigured(f"PREEMPTION_MODE={PREEMPTION_MODE!r} must be off, shadow or prod")
PREEMPTION_WEBHOOK_SECRET = env_str("PREEMPTION_WEBHOOK_SECRET", "dev-only-preemption-webhook-secret")
# A signed timestamp (X-Signature-Timestamp) older or newer than this is refused as a replay.
PREEMPTION_SIGNATURE_MAX_AGE_S = env_float("PREEMPTION_SIGNATURE_MAX_AGE_S", 300.0)
# A webhook's or an agent's notice body above this is refused (413) before its signature is checked.
PREEMPTION_MAX_BODY_BYTES = env_int("PREEMPTION_MAX_BODY_BYTES", 256 * 1024)
# A rebalance recommendation marks its node at risk this long, unless a terminate comes first.
PREEMPTION_AT_RISK_S = env_float("PREEMPTION_AT_RISK_S", 1800.0)
# Placement leaves a capacity pool's spot nodes alone this long after a preemption in it.
POOL_AVOID_AFTER_INTERRUPTION_S = env_float("POOL_AVOID_AFTER_INTERRUPTION_S", 180.0)
# Shadow predictions: a typical answer's length, for when an in-flight request would finish.
PREEMPTION_TYPICAL_OUTPUT_TOKENS = env_int("PREEMPTION_TYPICAL_OUTPUT_TOKENS", 256)

CELERY_BEAT_SCHEDULE = {
    "drain-tick": {
        "task": "nodes.tasks.drain_tick",
        "schedule": timedelta(seconds=DRAIN_TICK_S),
        "options": {"expires": DRAIN_TICK_S * 2},
    },
    "rental-reclaim-tick": {
        "task": "rentals.tasks.rental_tick",
        "schedule": timedelta(seconds=DRAIN_TICK_S),
        "options": {"expires": DRAIN_TICK_S * 2},
    },
    "heartbeat-guard": {
        "task": "nodes.tasks.heartbeat_guard",
        "schedule": timedelta(seconds=HEARTBEAT_GUARD_S),
        "options": {"expires": HEARTBEAT_GUARD_S * 2},
    },
    "request-log-retention": {
        "task": "inference.tasks.prune_request_log",
        "schedule": timedelta(hours=1),
        "options": {"expires": 3600},
    },
    "reputation-recompute": {
        "task": "reputation.tasks.recompute_reputation",
        "schedule": timedelta(hours=1),
        "options": {"expires": 3600},
    },
    "render-scheduler": {
        "task": "rentals.tasks.schedule_render_jobs_task",
        "schedule": timedelta(seconds=RECOVERY_S),
        "options": {"expires": RECOVERY_S * 2},
    },
    "recovery": {
        "task": "nodes.tasks.recovery_task",
        "schedule": timedelta(seconds=RECOVERY_S),
        "options": {"expires": RECOVERY_S * 2},
    },
}

METRICS_TOKEN = env_str("METRICS_TOKEN", "")
READYZ_TIMEOUT_S = env_float("READYZ_TIMEOUT_S", 1.0)

LOG_FORMAT = env_str("LOG_FORMAT", "plain")
if LOG_FORMAT not in ("plain", "json"):
    raise ImproperlyConfigured(f"LOG_FORMAT={LOG_FORMAT!r}: use plain or json")
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {
        "plain": {"format": "%(asctime)s %(levelname)s %(name)s %(message)s"},
        "json": {
            "()": "pythonjsonlogger.json.JsonFormatter",
            "fmt": "%(asctime)s %(levelname)s %(name)s %(message)s",
            "rename_fields": {"asctime": "time", "levelname": "level", "name": "logger"},
        },
    },
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": LOG_FORMAT}},
    "root": {"handlers": ["console"], "level": env_str("LOG_LEVEL", "INFO")},
    "loggers": {"django.db.backends": {"level": "WARNING"}},
}

# --- Production hardening (DEBUG=false) ---------------------------------------------
# TLS usually ends at the load balancer: trust its X-Forwarded-Proto, and let
# the operator turn on the redirect and HSTS there (docs/deploy.md lists the
# production environment under which `manage.py check --deploy` passes).
if not DEBUG:
    if SECRET_KEY.startswith("dev-only"):
        raise ImproperlyConfigured("SECRET_KEY must be set when DEBUG is false")
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
    SESSION_COOKIE_SECURE = env_bool("SESSION_COOKIE_SECURE", True)
    CSRF_COOKIE_SECURE = env_bool("CSRF_COOKIE_SECURE", True)
    SECURE_SSL_REDIRECT = env_bool("SECURE_SSL_REDIRECT", False)
    # Probes, scrapes and agents speak plain HTTP inside the network.
    SECURE_REDIRECT_EXEMPT = [r"^healthz$", r"^readyz$", r"^metrics$", r"^api/v1/agent/", r"^meta/"]
    SECURE_HSTS_SECONDS = env_int("SECURE_HSTS_SECONDS", 0)
    SECURE_HSTS_INCLUDE_SUBDOMAINS = env_bool("SECURE_HSTS_INCLUDE_SUBDOMAINS", False)
    SECURE_HSTS_PRELOAD = env_bool("SECURE_HSTS_PRELOAD", False)
    SECURE_CONTENT_TYPE_NOSNIFF = True
