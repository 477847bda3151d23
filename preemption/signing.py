"""Webhook signatures (R14): `X-Signature: sha256=<hex HMAC-SHA256 of the raw body>`.

With `X-Signature-Timestamp: <unix seconds>` the MAC covers `f"{ts}.{body}"`
instead, and a timestamp further than PREEMPTION_SIGNATURE_MAX_AGE_S from our
clock is refused, so a captured request cannot be replayed later. Without the
header a replay is still harmless: the same notice is the same row (R12).
"""

import hashlib
import hmac
import math
from typing import Any

from django.conf import settings
from django.utils import timezone
from drf_spectacular.extensions import OpenApiAuthenticationExtension
from rest_framework import authentication, exceptions

from marketplace.auth import AgentPrincipal

SIGNATURE_HEADER = "X-Signature"
TIMESTAMP_HEADER = "X-Signature-Timestamp"
PREFIX = "sha256="


def signed_payload(body: bytes, timestamp: str | None = None) -> bytes:
    return body if timestamp is None else timestamp.encode() + b"." + body


def sign(body: bytes, *, secret: str | None = None, timestamp: str | None = None) -> str:
    """The X-Signature value for a body (what a sender computes)."""
    key = (secret if secret is not None else settings.PREEMPTION_WEBHOOK_SECRET).encode()
    return PREFIX + hmac.new(key, signed_payload(body, timestamp), hashlib.sha256).hexdigest()


class BadSignature(exceptions.AuthenticationFailed):
    default_detail = "The webhook's X-Signature is missing or does not match its body."
    default_code = "bad_signature"

    def __init__(self, detail: str | None = None, code: str | None = None) -> None:
        super().__init__(detail or self.default_detail, code or self.default_code)


def verify(*, body: bytes, signature: str | None, timestamp: str | None) -> None:
    """Raises BadSignature unless the signature matches (and its timestamp is fresh)."""
    if not signature or not signature.startswith(PREFIX):
        raise BadSignature()
    if timestamp is not None:
        try:
            ts = float(timestamp)
        except ValueError:
            ts = math.nan
        if not math.isfinite(ts):
            # "nan" would pass any window check: a MAC over it would never expire.
            raise BadSignature("X-Signature-Timestamp must be unix seconds.")
        if abs(timezone.now().timestamp() - ts) > settings.PREEMPTION_SIGNATURE_MAX_AGE_S:
            raise BadSignature(
                f"The signed timestamp is more than {settings.PREEMPTION_SIGNATURE_MAX_AGE_S:g} s from now: "
                "refused as a replay.",
                code="stale_signature",
            )
    expected = sign(body, timestamp=timestamp)
    # Constant time, so the comparison leaks nothing about how much of a forgery matched.
    if not hmac.compare_digest(expected.encode(), signature.strip().encode()):
        raise BadSignature()


class BodyTooLarge(exceptions.APIException):
    status_code = 413
    default_detail = "The body is larger than PREEMPTION_MAX_BODY_BYTES; no cloud's notice is."
    default_code = "too_large"


def check_size(request: Any) -> None:
    """Before the HMAC and before any parsing: a cloud's notice is a few KB (EventBridge caps events at 256 KB)."""
    try:
        length = int(request.META.get("CONTENT_LENGTH") or 0)
    except ValueError:
        length = 0
    if length > settings.PREEMPTION_MAX_BODY_BYTES:
        raise BodyTooLarge()


class WebhookPrincipal(AgentPrincipal):
    """Stands in for request.user on a signed webhook: the sender holds the shared secret."""


class WebhookSignatureAuthentication(authentication.BaseAuthentication):
    def authenticate(self, request: Any) -> tuple[WebhookPrincipal, str]:
        check_size(request)
        verify(
            body=request.body,
            signature=request.headers.get(SIGNATURE_HEADER),
            timestamp=request.headers.get(TIMESTAMP_HEADER),
        )
        return WebhookPrincipal(), "webhook"

    def authenticate_header(self, request: Any) -> str:
        # A 401, not a 403, for a missing or bad signature.
        return 'HMAC-SHA256 header="X-Signature"'


class WebhookSignatureScheme(OpenApiAuthenticationExtension):
    target_class = "preemption.signing.WebhookSignatureAuthentication"
    name = "webhookSignature"

    def get_security_definition(self, auto_schema: Any) -> dict[str, str]:
        return {
            "type": "apiKey",
            "in": "header",
            "name": SIGNATURE_HEADER,
            "description": (
                "sha256=<hex HMAC-SHA256 of the raw body> with PREEMPTION_WEBHOOK_SECRET; with "
                "X-Signature-Timestamp: <unix seconds>, the HMAC of '<ts>.<body>' (refused after 5 minutes)."
            ),
        }
