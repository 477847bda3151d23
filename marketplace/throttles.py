"""Rate limits (issue #8): login per IP and username, agents per token, webhooks per sender IP.

Counters live in Django's cache (Redis when CACHE_URL/REDIS_URL is set, else
local memory: per process). Rates are read from settings on every request, so
an operator (or a test) changes them without a restart of the class; a rate of
"" or None turns a limit off. No safety rule depends on them: the agent
heartbeat, which carries every stop command, is never limited (README,
Operations), and a throttled call changes nothing.
"""

import hashlib
import math
from typing import Any

from django.conf import settings
from django.contrib.auth import views as auth_views
from django.core.exceptions import NON_FIELD_ERRORS
from django.forms.utils import ErrorDict
from django.http import HttpRequest, HttpResponse
from rest_framework.exceptions import ParseError
from rest_framework.throttling import SimpleRateThrottle


class SettingsRateThrottle(SimpleRateThrottle):
    """A SimpleRateThrottle whose rate is the setting `THROTTLE_<SCOPE>_RATE`, read per request."""

    def get_rate(self) -> str | None:
        return getattr(settings, f"THROTTLE_{self.scope.upper()}_RATE", None) or None

    def key(self, ident: str) -> str:
        return self.cache_format % {"scope": self.scope, "ident": ident}


def _username_digest(username: Any) -> str:
    name = username.strip().lower() if isinstance(username, str) else ""
    return hashlib.sha256(name.encode("utf-8", "replace")).hexdigest()[:32]


class LoginRateThrottle(SettingsRateThrottle):
    """POST /api/v1/auth/token and the portal's login form share one budget per (IP, username)."""

    scope = "login"

    def get_cache_key(self, request: Any, view: Any) -> str:
        if hasattr(request, "data"):  # DRF
            try:
                data = request.data
            except ParseError:
                data = {}
        else:
            data = request.POST
        username = data.get("username") if hasattr(data, "get") else None
        return self.key(f"{self.get_ident(request)}:{_username_digest(username)}")


class AgentRateThrottle(SettingsRateThrottle):
    """Per agent token (its node), after authentication; unknown tokens are a 401 first."""

    scope = "agent"

    def get_cache_key(self, request: Any, view: Any) -> str | None:
        node = getattr(request, "auth", None)
        return self.key(f"node:{node.pk}") if getattr(node, "pk", None) else None


class WebhookRateThrottle(SettingsRateThrottle):
    """Per sender IP, counting signed requests only (the signature is checked first)."""

    scope = "webhook"

    def get_cache_key(self, request: Any, view: Any) -> str:
        return self.key(self.get_ident(request))


class ThrottledLoginView(auth_views.LoginView):
    """Django's login view with the login budget checked before the password is."""

    def post(self, request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        throttle = LoginRateThrottle()
        if not throttle.allow_request(request, self):
            wait = throttle.wait() or 1
            form = self.get_form()
            # Set the errors without cleaning the form: cleaning would check the password.
            form.cleaned_data = {}
            form._errors = ErrorDict({NON_FIELD_ERRORS: form.error_class(["Too many sign-in attempts. Try again in a minute."])})
            response = self.render_to_response(self.get_context_data(form=form), status=429)
            response["Retry-After"] = str(max(1, math.ceil(wait)))
            return response
        return super().post(request, *args, **kwargs)
