"""The signed webhooks and the agent's route: 202 with what happened, 401 unsigned, 400 unreadable."""

import json
import time
from datetime import timedelta

import pytest
import time_machine

from nodes.models import Reclaim, Worker, WorkerStatus
from preemption.models import NoticeCount, PreemptionNotice
from tests.conftest import agent_client
from tests.factories import make_ready_worker
from tests.preemption import docs
from tests.preemption.docs import T0, signed_post

pytestmark = pytest.mark.django_db


def _no_trace():
    return not PreemptionNotice.objects.exists() and not Reclaim.objects.exists() and not NoticeCount.objects.exists()


@pytest.mark.parametrize(
    "signature",
    [None, "", "sha256=", "sha256=" + "0" * 64, "md5=abc", "deadbeef"],
    ids=["missing", "empty", "bare-prefix", "zeros", "other-scheme", "no-prefix"],
)
def test_r14_unsigned_or_forged_webhook_is_401_and_leaves_no_row(webhook, prod, model, signature):
    node, _ = docs.cloud_node(instance_id="i-0forged")
    make_ready_worker(node, model=model)
    body = json.dumps(docs.aws_warning(instance_id="i-0forged")).encode()
    headers = {} if signature is None else {"HTTP_X_SIGNATURE": signature}
    response = webhook.post("/api/v1/preemption/aws", data=body, content_type="application/json", **headers)
    assert response.status_code == 401
    assert response.json()["code"] == "bad_signature"
    assert _no_trace()
    node.refresh_from_db()
    assert node.workload_enabled is True


def test_r14_signature_over_another_body_or_with_another_secret_is_401(webhook, prod):
    docs.cloud_node(instance_id="i-0tamper")
    doc = docs.aws_warning(instance_id="i-0tamper")
    signed = json.dumps(doc).encode()
    tampered = signed.replace(b"i-0tamper", b"i-0other0")
    from preemption.signing import sign

    assert signed_post(webhook, "aws", raw=tampered, signature=sign(signed)).status_code == 401
    assert signed_post(webhook, "aws", doc, secret="not-the-secret").status_code == 401
    # The raw bytes are signed: the same JSON re-encoded with other spacing is another body.
    respaced = json.dumps(doc, indent=2).encode()
    assert signed_post(webhook, "aws", raw=respaced, signature=sign(signed)).status_code == 401
    assert _no_trace()


def test_r14_signed_timestamp_accepted_fresh_and_refused_as_a_replay_later(webhook, prod):
    docs.cloud_node(instance_id="i-0replay")
    doc = docs.aws_warning(instance_id="i-0replay")
    with time_machine.travel(T0, tick=False):
        ts = str(int(time.time()))
        assert signed_post(webhook, "aws", doc, timestamp=ts).status_code == 202
    with time_machine.travel(T0 + timedelta(minutes=5, seconds=1), tick=False):
        late = signed_post(webhook, "aws", doc, timestamp=ts)
    assert late.status_code == 401 and late.json()["code"] == "stale_signature"
    # The timestamp is inside the MAC: changing it breaks the signature.
    with time_machine.travel(T0, tick=False):
        from preemption.signing import sign

        body = json.dumps(doc).encode()
        forged = webhook.post(
            "/api/v1/preemption/aws", data=body, content_type="application/json",
            HTTP_X_SIGNATURE=sign(body, timestamp=ts), HTTP_X_SIGNATURE_TIMESTAMP=str(int(ts) + 1),
        )
    assert forged.status_code == 401
    assert PreemptionNotice.objects.count() == 1


@pytest.mark.parametrize(
    ("source", "raw"),
    [
        ("aws", b"{not json"),
        ("aws", json.dumps({"detail-type": "EC2 Spot Instance Interruption Warning", "detail": {}}).encode()),
        ("azure", json.dumps({"Events": "none"}).encode()),
        ("gcp", json.dumps({"message": {"data": "!!"}}).encode()),
        ("generic", json.dumps({"event_id": "e1"}).encode()),
    ],
)
def test_unparseable_notice_is_400_with_a_reason_and_no_row(webhook, prod, source, raw):
    response = signed_post(webhook, source, raw=raw)
    assert response.status_code == 400
    body = response.json()
    assert body["code"] == "unparseable_notice" and body["detail"]
    assert not PreemptionNotice.objects.exists() and not Reclaim.objects.exists()


def test_unknown_instance_is_202_no_node_and_recorded(webhook, prod):
    response = signed_post(webhook, "aws", docs.aws_warning(instance_id="i-0nobodyknows"))
    assert response.status_code == 202
    body = response.json()
    assert body["action"] == "no_node" and body["duplicate"] is False and body["mode"] == "prod"
    notice = PreemptionNotice.objects.get(pk=body["notice_id"])
    assert notice.node is None and notice.instance_id == "i-0nobodyknows" and notice.action == "no_node"
    assert not Reclaim.objects.exists()


def test_each_cloud_webhook_reclaims_its_node_in_prod(webhook, prod, model):
    aws, _ = docs.cloud_node(cloud="aws", instance_id="i-0aws")
    azure, _ = docs.cloud_node(cloud="azure", instance_id="spot-vm-3", zone="westeurope-1")
    gcp, _ = docs.cloud_node(cloud="gcp", instance_id="spot-l4-9", zone="europe-west4-a")
    generic, _ = docs.cloud_node(cloud="lambda", instance_id="0a1b2c")
    for node in (aws, azure, gcp, generic):
        make_ready_worker(node, model=model)
    with time_machine.travel(T0, tick=False):
        replies = {
            aws.pk: signed_post(webhook, "aws", docs.aws_warning(instance_id="i-0aws", at=T0)),
            azure.pk: signed_post(webhook, "azure", docs.azure_doc(resources=["spot-vm-3"], not_before=T0 + timedelta(seconds=30))),
            # GCP names the instance by number and by name; the node knows it by name.
            gcp.pk: signed_post(webhook, "gcp", docs.gcp_push(name="spot-l4-9", at=T0)),
            generic.pk: signed_post(webhook, "generic", docs.generic(instance_id="0a1b2c", not_before=T0 + timedelta(seconds=60))),
        }
    expected = {aws.pk: 110, azure.pk: 20, gcp.pk: 20, generic.pk: 50}
    for node_id, response in replies.items():
        assert response.status_code == 202, response.content
        body = response.json()
        assert (body["action"], body["duplicate"], body["mode"]) == ("reclaimed", False, "prod")
        assert body["notices"][0]["node_id"] == node_id
        reclaim = Reclaim.objects.get(node_id=node_id)
        assert reclaim.trigger == "preemption"
        assert reclaim.deadline == T0 + timedelta(seconds=expected[node_id])
        assert Worker.objects.get(node_id=node_id).status in (WorkerStatus.DRAINING, WorkerStatus.STOPPED)


def test_agent_posts_what_it_read_from_its_metadata_service(prod, model):
    node, token = docs.cloud_node(instance_id="i-0agent")
    make_ready_worker(node, model=model)
    with time_machine.travel(T0, tick=False):
        response = agent_client(token).post(
            "/api/v1/agent/notices",
            {"source": "aws", "document": docs.imds_action(at=T0 + timedelta(seconds=120))},
            format="json",
        )
    assert response.status_code == 202
    assert response.json()["action"] == "reclaimed"
    notice = PreemptionNotice.objects.get()
    assert notice.via == "agent" and notice.node_id == node.pk
    assert Reclaim.objects.get(node=node).deadline == T0 + timedelta(seconds=110)


def test_r14_agent_notice_acts_only_on_its_own_node(prod, model):
    mine, token = docs.cloud_node(instance_id="i-0mine")
    theirs, _ = docs.cloud_node(instance_id="i-0theirs")
    make_ready_worker(theirs, model=model)
    event = docs.aws_warning(instance_id="i-0theirs")  # the agent forwards an event naming another instance
    response = agent_client(token).post("/api/v1/agent/notices", {"source": "aws", "document": event}, format="json")
    assert response.status_code == 202
    assert response.json()["notices"][0]["node_id"] == mine.pk
    theirs.refresh_from_db()
    assert theirs.workload_enabled is True


def test_agent_notice_needs_an_agent_token_and_a_known_source(webhook, prod):
    _, token = docs.cloud_node()
    assert webhook.post("/api/v1/agent/notices", {"source": "aws", "document": {}}, format="json").status_code == 401
    bad = agent_client(token).post("/api/v1/agent/notices", {"source": "oracle", "document": {}}, format="json")
    assert bad.status_code == 400 and "source" in bad.json()
    unread = agent_client(token).post("/api/v1/agent/notices", {"source": "aws", "document": {"hello": 1}}, format="json")
    assert unread.status_code == 400 and unread.json()["code"] == "unparseable_notice"


def test_well_formed_document_with_nothing_to_act_on_is_202_ignored(webhook, prod):
    response = signed_post(webhook, "azure", {"DocumentIncarnation": 4, "Events": []})
    assert response.status_code == 202
    assert response.json() == {"notice_id": None, "duplicate": False, "mode": "prod", "action": "ignored", "notices": []}
