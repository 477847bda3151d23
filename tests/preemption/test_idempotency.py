"""R12: idempotent by state. One interruption, however many notices, is one reclaim with the earliest deadline."""

from datetime import timedelta

import pytest
import time_machine

from nodes.models import Command, Reclaim, Worker, WorkerStatus
from nodes.recovery import drain_tick
from nodes.services import pause_node
from nodes.slots import acquire_slot, router_heartbeat
from preemption.models import PreemptionNotice, ShadowReclaim
from rentals.services import start_rental
from tests.conftest import agent_client
from tests.factories import make_ready_worker
from tests.preemption import docs
from tests.preemption.docs import T0, signed_post

pytestmark = pytest.mark.django_db


@pytest.fixture
def busy_node(model):
    """A spot node whose worker holds a request, so its drain stays open."""
    node, token = docs.cloud_node(instance_id="i-0busy")
    worker = make_ready_worker(node, model=model)
    router_heartbeat(instance_id="r1")
    acquire_slot(worker_id=worker.pk, router_instance="r1")
    return node, token, worker


def test_r12_redelivery_of_the_same_notice_is_the_same_row_and_changes_nothing(webhook, prod, busy_node):
    node, _, worker = busy_node
    doc = docs.aws_warning(instance_id="i-0busy", at=T0)
    first = signed_post(webhook, "aws", doc).json()
    again = signed_post(webhook, "aws", doc).json()
    assert first["duplicate"] is False and again["duplicate"] is True
    assert again["notice_id"] == first["notice_id"] and again["action"] == "reclaimed"
    assert PreemptionNotice.objects.count() == 1 and Reclaim.objects.count() == 1


def test_r12_webhook_and_agent_with_different_ids_reclaim_once(webhook, prod, busy_node):
    node, token, worker = busy_node
    webhook_reply = signed_post(webhook, "aws", docs.aws_warning(instance_id="i-0busy", at=T0)).json()
    agent_reply = agent_client(token).post(
        "/api/v1/agent/notices", {"source": "aws", "document": docs.imds_action(at=T0 + timedelta(seconds=120))}, format="json"
    )
    assert agent_reply.status_code == 202
    body = agent_reply.json()
    assert body["duplicate"] is True and body["action"] == "reclaimed"
    assert body["notice_id"] != webhook_reply["notice_id"]  # recorded, as its own receipt
    assert body["notices"][0]["reclaim_id"] == webhook_reply["notices"][0]["reclaim_id"]
    assert Reclaim.objects.count() == 1 and PreemptionNotice.objects.count() == 2


def test_r12_a_later_notice_with_an_earlier_not_before_moves_the_deadline_earlier(webhook, prod, owner, renter, model):
    node, token = docs.cloud_node(instance_id="i-0earlier", provider=owner)
    worker = make_ready_worker(node, model=model)
    router_heartbeat(instance_id="r1")
    acquire_slot(worker_id=worker.pk, router_instance="r1")
    # AWS's two minutes: deadline T0+110.
    signed_post(webhook, "aws", docs.aws_warning(instance_id="i-0earlier", at=T0))
    # Ten seconds later the agent reads an action due 30 s from then: T0+40-10 = T0+30.
    with time_machine.travel(T0 + timedelta(seconds=10), tick=False):
        reply = agent_client(token).post(
            "/api/v1/agent/notices", {"source": "aws", "document": docs.imds_action(at=T0 + timedelta(seconds=40))}, format="json"
        ).json()
    assert reply["duplicate"] is False and reply["action"] == "reclaimed"
    reclaim = Reclaim.objects.get()
    worker.refresh_from_db()
    assert reclaim.deadline == worker.drain_deadline == T0 + timedelta(seconds=30)
    # A later notice with a later not_before moves nothing back.
    with time_machine.travel(T0 + timedelta(seconds=12), tick=False):
        later = signed_post(webhook, "generic", docs.generic(instance_id="i-0earlier", not_before=T0 + timedelta(seconds=115))).json()
    assert later["duplicate"] is True
    reclaim.refresh_from_db()
    assert reclaim.deadline == T0 + timedelta(seconds=30)
    assert Reclaim.objects.count() == 1


def test_r12_an_earlier_notice_brings_rental_reclaims_forward_too(webhook, prod, owner, renter):
    node, _ = docs.cloud_node(instance_id="i-0rental", provider=owner)
    rental = start_rental(renter=renter, node_id=node.pk)
    pause_node(node_id=node.pk)  # the owner first: the rental has its 120 s
    rental.refresh_from_db()
    assert rental.reclaim_at == T0 + timedelta(seconds=120)
    reply = signed_post(webhook, "azure", docs.azure_doc(resources=["i-0rental"], not_before=T0 + timedelta(seconds=30))).json()
    assert reply["duplicate"] is False
    rental.refresh_from_db()
    assert rental.reclaim_at == T0 + timedelta(seconds=20)
    meta = webhook.get(f"/meta/{rental.notice_token}/latest/meta-data/spot/instance-action").json()
    assert meta["time"] == "2026-12-01T08:15:20Z"


def test_r12_a_pause_after_a_notice_changes_nothing(webhook, prod, busy_node):
    node, _, worker = busy_node
    reply = signed_post(webhook, "gcp", docs.gcp_push(name="spot-x", instance_id="i-0busy", at=T0)).json()
    with time_machine.travel(T0 + timedelta(seconds=5), tick=False):
        _, reclaim = pause_node(node_id=node.pk)
    assert reclaim.pk == reply["notices"][0]["reclaim_id"] and reclaim.trigger == "preemption"
    assert reclaim.deadline == T0 + timedelta(seconds=20)
    worker.refresh_from_db()
    assert worker.drain_deadline == T0 + timedelta(seconds=20)
    assert Reclaim.objects.count() == 1


def test_r12_notice_after_a_pause_takes_over_with_the_earlier_deadline(webhook, prod, busy_node):
    node, _, worker = busy_node
    _, paused = pause_node(node_id=node.pk)
    reply = signed_post(webhook, "gcp", docs.gcp_push(instance_id="i-0busy", at=T0)).json()
    assert reply["duplicate"] is False and reply["action"] == "reclaimed"
    paused.refresh_from_db()
    worker.refresh_from_db()
    assert paused.deadline == worker.drain_deadline == T0 + timedelta(seconds=20)
    assert Reclaim.objects.count() == 1  # the owner's drain, brought forward: not a second one


def test_r12_rebalance_and_terminate_together_reclaim_once(webhook, prod, busy_node):
    node, _, worker = busy_node
    rebalance = signed_post(webhook, "aws", docs.aws_rebalance(instance_id="i-0busy", at=T0)).json()
    warning = signed_post(webhook, "aws", docs.aws_warning(instance_id="i-0busy", at=T0)).json()
    again = signed_post(webhook, "aws", docs.aws_rebalance(instance_id="i-0busy", at=T0)).json()
    assert (rebalance["action"], rebalance["duplicate"]) == ("ignored", False)
    assert (warning["action"], warning["duplicate"]) == ("reclaimed", False)
    assert (again["action"], again["duplicate"]) == ("reclaimed", True)
    assert Reclaim.objects.count() == 1
    assert Reclaim.objects.get().deadline == T0 + timedelta(seconds=110)


def test_r12_azure_incarnation_n_plus_1_then_n_state_never_moves_back(webhook, prod, busy_node):
    node, _, worker = busy_node
    event_id = "0D4C3B2A-1908-4F7E-9D6C-5B4A39281706"
    newer = docs.azure_doc(resources=["i-0busy"], not_before=T0 + timedelta(seconds=60), incarnation=9, event_id=event_id)
    older = docs.azure_doc(resources=["i-0busy"], not_before=T0 + timedelta(seconds=30), incarnation=8, event_id=event_id)
    first = signed_post(webhook, "azure", newer).json()
    stale = signed_post(webhook, "azure", older).json()
    assert first["duplicate"] is False and stale["duplicate"] is True
    reclaim = Reclaim.objects.get()
    worker.refresh_from_db()
    # Incarnation 9 said T0+60: the stale 8's T0+30 does not count.
    assert reclaim.deadline == worker.drain_deadline == T0 + timedelta(seconds=50)
    assert PreemptionNotice.objects.get(pk=stale["notice_id"]).incarnation == 8


def test_r12_azure_stale_document_never_pulls_the_deadline_of_a_newer_one(webhook, prod, model):
    node, _ = docs.cloud_node(cloud="azure", instance_id="vm-spared")
    make_ready_worker(node, model=model)
    # Incarnation 5 is a Freeze only (no notice), 6 the Preempt at T0+60; then 4 arrives late saying T0+20.
    signed_post(webhook, "azure", docs.azure_doc(resources=["vm-spared"], not_before=T0 + timedelta(seconds=60), incarnation=5, event_type="Freeze"))
    signed_post(webhook, "azure", docs.azure_doc(resources=["vm-spared"], not_before=T0 + timedelta(seconds=60), incarnation=6))
    late = signed_post(webhook, "azure", docs.azure_doc(resources=["vm-spared"], not_before=T0 + timedelta(seconds=20), incarnation=4)).json()
    assert late["duplicate"] is True
    assert Reclaim.objects.get(node=node).deadline == T0 + timedelta(seconds=50)


def test_r12_shadow_is_idempotent_by_state_too(webhook, shadow, busy_node):
    node, token, _ = busy_node
    first = signed_post(webhook, "aws", docs.aws_warning(instance_id="i-0busy", at=T0)).json()
    agent = agent_client(token).post(
        "/api/v1/agent/notices", {"source": "aws", "document": docs.imds_action(at=T0 + timedelta(seconds=120))}, format="json"
    ).json()
    earlier = signed_post(webhook, "generic", docs.generic(instance_id="i-0busy", not_before=T0 + timedelta(seconds=40))).json()
    assert [first["duplicate"], agent["duplicate"], earlier["duplicate"]] == [False, True, False]
    shadow_reclaim = ShadowReclaim.objects.get()
    assert shadow_reclaim.deadline == T0 + timedelta(seconds=30)
    assert shadow_reclaim.predicted["deadline"] == (T0 + timedelta(seconds=30)).isoformat()
    assert not Reclaim.objects.exists()


def test_r12_notice_for_a_node_that_already_stopped_everything_is_a_duplicate(webhook, prod, model):
    node, _ = docs.cloud_node(instance_id="i-0idle")
    make_ready_worker(node, model=model)  # nothing in flight: stopped at once
    signed_post(webhook, "aws", docs.aws_warning(instance_id="i-0idle", at=T0))
    drain_tick()  # what the on-commit finish_drain does at once outside a test's transaction
    assert Worker.objects.get(node=node).status == WorkerStatus.STOPPED
    later = signed_post(webhook, "gcp", docs.gcp_push(instance_id="i-0idle", at=T0)).json()
    assert later["duplicate"] is True and later["action"] == "reclaimed"
    assert Command.objects.filter(kind="stop_worker").count() == 1


def test_r12_a_notice_on_a_node_draining_for_a_rentals_start_brings_that_drain_forward(webhook, prod, renter, busy_node):
    node, _, worker = busy_node
    start_rental(renter=renter, node_id=node.pk)  # the worker drains first (rental_start, 120 s)
    worker.refresh_from_db()
    assert worker.status == WorkerStatus.DRAINING and worker.drain_deadline == T0 + timedelta(seconds=120)
    reply = signed_post(webhook, "gcp", docs.gcp_push(instance_id="i-0busy", at=T0)).json()
    assert reply["action"] == "reclaimed" and reply["duplicate"] is False
    worker.refresh_from_db()
    assert worker.drain_deadline == T0 + timedelta(seconds=20)
    assert set(Reclaim.objects.values_list("trigger", "deadline")) == {
        ("rental_start", T0 + timedelta(seconds=20)),
        ("preemption", T0 + timedelta(seconds=20)),
    }
