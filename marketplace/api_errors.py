"""One error shape for /api: {"code", "detail"} plus field errors on 400."""

import math
from typing import Any

from django.core.exceptions import PermissionDenied
from django.http import Http404
from rest_framework import exceptions, status
from rest_framework.response import Response
from rest_framework.views import set_rollback

from marketplace.errors import DomainError


def exception_handler(exc: Exception, context: dict[str, Any]) -> Response | None:
    if isinstance(exc, DomainError):
        set_rollback()
        return Response({"code": exc.code, "detail": exc.detail}, status=exc.status_code)
    if isinstance(exc, Http404):
        exc = exceptions.NotFound()
    elif isinstance(exc, PermissionDenied):
        exc = exceptions.PermissionDenied()
    if not isinstance(exc, exceptions.APIException):
        return None

    headers = {}
    if getattr(exc, "auth_header", None):
        headers["WWW-Authenticate"] = exc.auth_header
    if getattr(exc, "wait", None):
        headers["Retry-After"] = str(max(1, math.ceil(exc.wait)))

    if isinstance(exc, exceptions.ValidationError):
        body: dict[str, Any] = {"code": "invalid", "detail": "Some fields are invalid; see the field errors."}
        if isinstance(exc.detail, dict):
            # Field errors sit beside code/detail, named by field as DRF names them.
            for field, errors in exc.detail.items():
                key = "non_field_errors" if field in ("code", "detail") else field
                body[key] = errors
        else:
            body["non_field_errors"] = exc.detail
    else:
        code = exc.get_codes() if isinstance(exc.get_codes(), str) else exc.default_code
        body = {"code": code, "detail": str(exc.detail)}
    set_rollback()
    return Response(body, status=exc.status_code or status.HTTP_400_BAD_REQUEST, headers=headers)
