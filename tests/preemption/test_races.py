"""R12 under real concurrency, on PostgreSQL with threads: the node's row lock orders the notices."""

import json
from datetime import timedelta

import pytest
from rest_framework.test import APIClient

from nodes.models import Command, Reclaim, Worker, WorkerStatus
from preemption.models import PreemptionNotice
from preemption.signing import sign
from tests.conftest import agent_client
from tests.factories import make_ready_worker
from tests.preemption import docs
from tests.preemption.docs import T0
from tests.test_races import run_threads

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]


def _post_signed(body: bytes):
    return APIClient().post(
        "/api/v1/preemption/aws", data=body, content_type="application/json", HTTP_X_SIGNATURE=sign(body)
    )


@pytest.mark.parametrize("round_", range(4))
def test_r12_three_identical_aws_webhooks_and_the_agent_at_once_reclaim_once(prod, model, round_):
    node, token = docs.cloud_node(instance_id=f"i-0race{round_}")
    make_ready_worker(node, model=model)  # idle: its drain stops it on commit, one stop command
    body = json.dumps(docs.aws_warning(instance_id=f"i-0race{round_}", at=T0)).encode()
    agent_doc = {"source": "aws", "document": docs.imds_action(at=T0 + timedelta(seconds=120))}
    calls = [lambda: _post_signed(body)] * 3 + [lambda: agent_client(token).post("/api/v1/agent/notices", agent_doc, format="json")]
    results = run_threads(calls)

    assert [getattr(r, "status_code", r) for r in results] == [202, 202, 202, 202]
    replies = [r.json() for r in results]
    assert all(r["action"] == "reclaimed" for r in replies)
    assert sum(not r["duplicate"] for r in replies) == 1  # exactly one of them did anything
    assert Reclaim.objects.filter(node=node).count() == 1
    assert Command.objects.filter(node=node, kind="stop_worker").count() == 1
    assert Worker.objects.get(node=node).status == WorkerStatus.STOPPED
    assert PreemptionNotice.objects.filter(node=node).count() == 2  # the event once, the agent's read once
    assert len({r["notice_id"] for r in replies[:3]}) == 1


def test_r12_one_unknown_notice_twice_at_once_is_one_row(prod):
    body = json.dumps(docs.aws_warning(instance_id="i-0ghost", at=T0)).encode()
    results = run_threads([lambda: _post_signed(body)] * 4)
    assert [getattr(r, "status_code", r) for r in results] == [202] * 4
    assert PreemptionNotice.objects.count() == 1
    assert sorted(r.json()["duplicate"] for r in results) == [False, True, True, True]
