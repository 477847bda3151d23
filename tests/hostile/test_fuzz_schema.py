"""Issue #8: Schemathesis over every operation of /api/schema/, in-process (WSGI), with
valid credentials for each caller: no 5xx, 2xx bodies match the schema, and no
operation ignores its authentication.

Users send `Authorization: Token ...` (the provider for their endpoints, staff for
/staff/), agents `Bearer <agent token>`, and the cloud webhooks a body signed
with PREEMPTION_WEBHOOK_SECRET (the signature is computed over the exact bytes
sent). Examples are bounded and derandomized so the run is repeatable and short;
FUZZ_EXAMPLES raises the bound for a deeper local run.
"""

import json
import os
from collections import Counter
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings as hsettings
from hypothesis.errors import Unsatisfiable
from rest_framework.authtoken.models import Token

import schemathesis
from schemathesis import GenerationMode
from schemathesis.checks import (
    ignored_auth,
    not_a_server_error,
    response_schema_conformance,
)
from marketplace.wsgi import application
from inference.keys import create_api_key
from nodes.models import Command
from nodes.placement import place_worker
from preemption.signing import sign
from rentals.render import create_render_job
from rentals.services import start_rental
from tests.factories import UserFactory, make_node

pytestmark = pytest.mark.django_db

MAX_EXAMPLES = int(os.environ.get("FUZZ_EXAMPLES", "20"))
CHECKS = [not_a_server_error, response_schema_conformance]


@pytest.fixture(autouse=True)
def _keep_the_test_connection():
    """The WSGI handler closes connections around each request; inside the test's
    transaction it must not (Django's test client does the same)."""
    from django.core.signals import request_finished, request_started
    from django.db import close_old_connections

    request_started.disconnect(close_old_connections)
    request_finished.disconnect(close_old_connections)
    yield
    request_started.connect(close_old_connections)
    request_finished.connect(close_old_connections)


@pytest.fixture
def world(model, settings):
    settings.THROTTLE_LOGIN_RATE = settings.THROTTLE_AGENT_RATE = settings.THROTTLE_WEBHOOK_RATE = ""
    owner = UserFactory(username="owner")
    renter = UserFactory(username="renter")
    staff = UserFactory(username="staff", is_staff=True)
    node, agent_token = make_node(provider=owner, is_spot=True, cloud="aws", cloud_instance_id="i-0fuzz")
    other_node, _ = make_node(provider=renter, is_spot=False)
    place_worker(node)
    rental = start_rental(renter=owner, node_id=other_node.pk)
    job = create_render_job(renter=owner, frames="1-10")
    key, _ = create_api_key(user=owner, name="k")
    return {
        "user": Token.objects.create(user=owner).key,
        "staff": Token.objects.create(user=staff).key,
        "agent": agent_token,
        # Real ids for a second positive run, so generated bodies reach past the 404.
        "ids": {
            "node_id": node.pk, "rental_id": rental.pk, "key_id": key.pk, "job_id": job.pk, "provider_id": owner.pk,
            "command_id": str(Command.objects.filter(node=node).values_list("pk", flat=True).first()),
        },
    }


def credentials(path: str, world: dict[str, str]) -> dict[str, str]:
    if path.startswith("/api/v1/agent/"):
        return {"Authorization": f"Bearer {world['agent']}"}
    if path.startswith("/api/v1/preemption/") or path == "/api/v1/auth/token":
        return {}
    if path.startswith("/api/v1/staff/"):
        return {"Authorization": f"Token {world['staff']}"}
    return {"Authorization": f"Token {world['user']}"}


def send(case: Any, world: dict[str, str]) -> Any:
    path = case.operation.path
    headers = credentials(path, world)
    if path.startswith("/api/v1/preemption/"):
        body = case.body
        raw = b"" if _not_set(body) else body if isinstance(body, bytes) else json.dumps(body).encode()
        headers.update({"X-Signature": sign(raw), "Content-Type": "application/json"})
        return case.call(headers=headers, data=raw)
    return case.call(headers=headers)


def _not_set(value: Any) -> bool:
    return type(value).__name__ == "NotSet"


def test_schemathesis_every_operation_no_5xx_and_responses_match_the_schema(world, capsys):
    schema = schemathesis.openapi.from_wsgi("/api/schema/", application)
    operations = [result.ok() for result in schema.get_all_operations()]
    assert len(operations) >= 30, [op.label for op in operations]
    sent: Counter[str] = Counter()
    statuses: Counter[int] = Counter()

    for operation in operations:
        names = [p.name for p in operation.path_parameters]
        runs = [(GenerationMode.POSITIVE, None), (GenerationMode.NEGATIVE, None)]
        if names:
            runs.append((GenerationMode.POSITIVE, {name: world["ids"][name] for name in names}))
        for mode, path_parameters in runs:

            @hsettings(
                max_examples=MAX_EXAMPLES,
                deadline=None,
                derandomize=True,
                database=None,
                suppress_health_check=list(HealthCheck),
            )
            @given(case=operation.as_strategy(generation_mode=mode, path_parameters=path_parameters))
            def run(case: Any) -> None:
                response = send(case, world)
                sent[operation.label] += 1
                statuses[response.status_code] += 1
                # Negative cases are checked for 5xx only; positive ones for the schema too.
                checks = CHECKS if mode == GenerationMode.POSITIVE else [not_a_server_error]
                case.validate_response(response, checks=checks)

            try:
                run()
            except Unsatisfiable:
                # Nothing in the operation can be made invalid (no body, no parameters): positive only.
                assert mode == GenerationMode.NEGATIVE, operation.label

    total = sum(sent.values())
    with capsys.disabled():
        print(f"\nschemathesis: {total} generated requests over {len(operations)} operations; statuses {dict(sorted(statuses.items()))}")
    assert total >= len(operations) * 2
    assert not any(code >= 500 for code in statuses)


def test_schemathesis_no_operation_ignores_authentication(world):
    """Each operation, sent once without credentials, is refused (401/403), the login excepted."""
    schema = schemathesis.openapi.from_wsgi("/api/schema/", application)
    refused = {}
    for result in schema.get_all_operations():
        operation = result.ok()
        if operation.path == "/api/v1/auth/token":
            continue

        @hsettings(max_examples=1, deadline=None, derandomize=True, database=None, suppress_health_check=list(HealthCheck))
        @given(case=operation.as_strategy(generation_mode=GenerationMode.POSITIVE))
        def run(case: Any) -> None:
            refused[operation.label] = case.call().status_code

        run()
    assert refused and all(code in (401, 403) for code in refused.values()), refused
