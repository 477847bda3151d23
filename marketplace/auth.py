"""Node agents authenticate with `Authorization: Bearer <agent token>`; one token, one node."""

from typing import Any

from django.contrib.auth.models import AnonymousUser
from drf_spectacular.extensions import OpenApiAuthenticationExtension
from rest_framework import authentication, exceptions, permissions

from nodes.models import Node
from nodes.tokens import hash_token


class AgentPrincipal(AnonymousUser):
    """Stands in for request.user on agent calls; the node is request.auth."""

    @property
    def is_authenticated(self) -> bool:  # type: ignore[override]
        return True


class AgentTokenAuthentication(authentication.BaseAuthentication):
    keyword = "Bearer"

    def authenticate(self, request: Any) -> tuple[AgentPrincipal, Node] | None:
        header = authentication.get_authorization_header(request).split()
        if not header or header[0].lower() != self.keyword.lower().encode():
            return None
        if len(header) != 2:
            raise exceptions.AuthenticationFailed("Malformed Authorization header.")
        try:
            token = header[1].decode()
        except UnicodeError:
            raise exceptions.AuthenticationFailed("Malformed agent token.") from None
        node = Node.objects.filter(agent_token_hash=hash_token(token)).first()
        if node is None:
            raise exceptions.AuthenticationFailed("Unknown agent token.")
        return AgentPrincipal(), node

    def authenticate_header(self, request: Any) -> str:
        return self.keyword


class IsAgent(permissions.BasePermission):
    def has_permission(self, request: Any, view: Any) -> bool:
        return isinstance(request.auth, Node)


class IsUser(permissions.BasePermission):
    """A signed-in person (token or session), never an agent token."""

    def has_permission(self, request: Any, view: Any) -> bool:
        return bool(request.user and request.user.is_authenticated and not isinstance(request.auth, Node))


class AgentTokenScheme(OpenApiAuthenticationExtension):
    target_class = "marketplace.auth.AgentTokenAuthentication"
    name = "agentToken"

    def get_security_definition(self, auto_schema: Any) -> dict[str, str]:
        return {"type": "http", "scheme": "bearer", "description": "The node's agent token."}
