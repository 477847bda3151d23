"""API keys for the inference router: created once, looked up by hash, cached briefly."""

import hashlib
import secrets
import time

from django.contrib.auth.models import AbstractBaseUser
from django.utils import timezone

from inference.models import ApiKey


def hash_key(raw: str) -> str:
    return hashlib.sha256(raw.encode()).hexdigest()


def create_api_key(*, user: AbstractBaseUser, name: str = "") -> tuple[ApiKey, str]:
    raw = "sk-mkt-" + secrets.token_urlsafe(32)
    key = ApiKey.objects.create(user=user, name=name, prefix=raw[:12], key_hash=hash_key(raw))
    return key, raw


def revoke_api_key(*, key: ApiKey) -> ApiKey:
    if key.revoked_at is None:
        key.revoked_at = timezone.now()
        key.save(update_fields=["revoked_at"])
    return key


class KeyCache:
    """hash -> key id for a few seconds, so a revoked key stops within `ttl_s`."""

    def __init__(self, ttl_s: float = 10.0, max_entries: int = 100_000):
        self.ttl_s = ttl_s
        self.max_entries = max_entries
        self._entries: dict[str, tuple[int | None, float]] = {}

    def get(self, key_hash: str) -> tuple[bool, int | None]:
        hit = self._entries.get(key_hash)
        if hit is None or hit[1] < time.monotonic():
            return False, None
        return True, hit[0]

    def put(self, key_hash: str, key_id: int | None) -> None:
        if len(self._entries) >= self.max_entries:
            self._entries.clear()
        self._entries[key_hash] = (key_id, time.monotonic() + self.ttl_s)
