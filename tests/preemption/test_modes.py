"""R12 per mode: off records nothing, shadow predicts and reroutes nothing, prod drains by the notice."""

from datetime import timedelta

import pytest
import time_machine

from nodes.models import Command, NodeEvent, Reclaim, Worker, WorkerStatus
from nodes.recovery import drain_tick
from nodes.slots import acquire_slot, admit, router_heartbeat
from preemption.models import NoticeCount, PreemptionNotice, PreemptionPolicy, ShadowReclaim
from preemption.services import policy_for
from rentals.models import Rental, RentalStatus
from rentals.services import start_rental
from tests.factories import make_ready_worker
from tests.preemption import docs
from tests.preemption.docs import T0, signed_post

pytestmark = pytest.mark.django_db


def test_r12_off_records_no_reclaim_only_the_receipt_count(webhook, off, model):
    node, _ = docs.cloud_node(instance_id="i-0off")
    make_ready_worker(node, model=model)
    response = signed_post(webhook, "aws", docs.aws_warning(instance_id="i-0off"))
    assert response.status_code == 202
    assert response.json() == {"notice_id": None, "duplicate": False, "mode": "off", "action": "ignored", "notices": []}
    assert not PreemptionNotice.objects.exists() and not Reclaim.objects.exists() and not ShadowReclaim.objects.exists()
    node.refresh_from_db()
    assert node.workload_enabled is True
    assert NoticeCount.objects.get().count == 1
    # Off does not even read the document: an unreadable one is counted, not refused.
    assert signed_post(webhook, "aws", raw=b"not json").status_code == 202
    assert NoticeCount.objects.get(source="aws", mode="off", action="ignored").count == 2


def test_r14_off_still_refuses_an_unsigned_webhook(webhook, off):
    response = webhook.post("/api/v1/preemption/aws", data=b"{}", content_type="application/json")
    assert response.status_code == 401 and not NoticeCount.objects.exists()


def test_r12_shadow_reroutes_nothing_and_records_would_reclaim_spot_with_a_timeline(webhook, shadow, owner, renter, model):
    node, _ = docs.cloud_node(instance_id="i-0shadow", provider=owner)
    worker = make_ready_worker(node, model=model)  # 50 tokens/s
    router_heartbeat(instance_id="r1")
    with time_machine.travel(T0 - timedelta(seconds=100), tick=False):
        old = acquire_slot(worker_id=worker.pk, router_instance="r1", request_id="old")
    with time_machine.travel(T0 - timedelta(seconds=1), tick=False):
        fresh = acquire_slot(worker_id=worker.pk, router_instance="r1", request_id="fresh")
    assert old and fresh
    with time_machine.travel(T0, tick=False):
        response = signed_post(webhook, "gcp", docs.gcp_push(instance_id="i-0shadow", at=T0))
    body = response.json()
    assert response.status_code == 202
    assert (body["action"], body["mode"], body["duplicate"]) == ("would_reclaim_spot", "shadow", False)

    # Nothing moved: the node holds workload, the worker is ready and still admits.
    node.refresh_from_db()
    worker.refresh_from_db()
    assert node.workload_enabled is True and worker.status == WorkerStatus.READY
    assert not Reclaim.objects.exists() and not Command.objects.filter(kind="stop_worker").exists()
    assert admit(model_id=model.pk, router_instance="r1") is not None
    assert not NodeEvent.objects.filter(kind__in=["drain_started", "workload_disabled"]).exists()

    shadow_reclaim = ShadowReclaim.objects.get(pk=body["notices"][0]["shadow_reclaim_id"])
    assert shadow_reclaim.deadline == T0 + timedelta(seconds=20)  # GCP: 30 s, less the 10 s margin
    timeline = shadow_reclaim.predicted
    assert timeline["in_flight"] == 2 and len(timeline["workers"]) == 1
    requests = {r["request_id"]: r for r in timeline["workers"][0]["requests"]}
    # 256 tokens at 50 tokens/s: about 5 s. The old one is past that (ends now), the fresh one ends at +4.12 s.
    assert requests["old"]["age_s"] == 100 and requests["old"]["would_cut"] is False
    assert requests["fresh"]["expected_end"] == (T0 + timedelta(seconds=4.12)).isoformat()
    # At the longest the router allows on spot (120 s of generation) the fresh one could outlive 20 s;
    # the old one reaches exactly the deadline at the longest (admitted 100 s ago + 120 s = +20 s)
    assert shadow_reclaim.would_cut == 0 and shadow_reclaim.may_cut == 1
    assert requests["fresh"]["may_cut"] is True and requests["old"]["may_cut"] is False
    assert PreemptionNotice.objects.get().shadow_reclaim == shadow_reclaim


def test_r12_shadow_lists_the_rentals_that_would_get_notice(webhook, shadow, owner, renter):
    node, _ = docs.cloud_node(instance_id="i-0rented", provider=owner)
    with time_machine.travel(T0, tick=False):
        rental = start_rental(renter=renter, node_id=node.pk)
        signed_post(webhook, "aws", docs.aws_warning(instance_id="i-0rented", at=T0))
    prediction = ShadowReclaim.objects.get().predicted
    assert prediction["rentals"] == [{"rental_id": rental.pk, "reclaim_at": (T0 + timedelta(seconds=110)).isoformat()}]
    rental.refresh_from_db()
    assert rental.status == RentalStatus.ACTIVE and rental.reclaim_at is None


def test_r12_prod_30_second_azure_notice_stops_the_worker_by_about_20_seconds(webhook, prod, model):
    node, _ = docs.cloud_node(cloud="azure", instance_id="spot-vm-30s")
    worker = make_ready_worker(node, model=model)
    router_heartbeat(instance_id="r1")
    acquire_slot(worker_id=worker.pk, router_instance="r1")  # a request that never ends
    with time_machine.travel(T0, tick=False):
        response = signed_post(webhook, "azure", docs.azure_doc(resources=["spot-vm-30s"], not_before=T0 + timedelta(seconds=30)))
    assert response.json()["action"] == "reclaimed"
    worker.refresh_from_db()
    assert worker.status == WorkerStatus.DRAINING and worker.drain_deadline == T0 + timedelta(seconds=20)
    assert admit(model_id=model.pk, router_instance="r1") is None  # the router's cut-off: committed with the notice

    with time_machine.travel(T0 + timedelta(seconds=19.9), tick=False):
        drain_tick()
    worker.refresh_from_db()
    assert worker.status == WorkerStatus.DRAINING
    with time_machine.travel(T0 + timedelta(seconds=20), tick=False):
        drain_tick()
    worker.refresh_from_db()
    assert worker.status == WorkerStatus.STOPPED and worker.stop_reason == "ceiling"
    assert worker.stopped_at == T0 + timedelta(seconds=20) and worker.requests_cut == 1
    assert Command.objects.filter(worker=worker, kind="stop_worker").count() == 1


def test_r12_prod_gives_rentals_the_notices_deadline_and_the_imds_answer(webhook, prod, owner, renter):
    node, _ = docs.cloud_node(cloud="gcp", instance_id="spot-l4-1", provider=owner)
    with time_machine.travel(T0, tick=False):
        rental = start_rental(renter=renter, node_id=node.pk)
        signed_post(webhook, "gcp", docs.gcp_push(name="spot-l4-1", at=T0))
    rental.refresh_from_db()
    assert rental.status == RentalStatus.RECLAIMING and rental.reclaim_at == T0 + timedelta(seconds=20)
    meta = webhook.get(f"/meta/{rental.notice_token}/latest/meta-data/spot/instance-action")
    assert meta.json() == {"action": "terminate", "time": "2026-12-01T08:15:20Z"}


def test_r12_prod_reclaims_an_on_demand_listing_too_the_cloud_takes_it_anyway(webhook, prod, model):
    node, _ = docs.cloud_node(instance_id="i-0ondemand", is_spot=False)
    make_ready_worker(node, model=model)
    assert signed_post(webhook, "aws", docs.aws_warning(instance_id="i-0ondemand")).json()["action"] == "reclaimed"
    node.refresh_from_db()
    assert node.workload_enabled is False


def test_mode_per_cloud_overrides_the_setting_and_is_recorded_on_each_notice(webhook, shadow, model):
    PreemptionPolicy.objects.create(source="azure", mode="prod")
    PreemptionPolicy.objects.create(source="aws", mode="")  # blank: follows the setting
    assert policy_for("azure").mode == "prod" and policy_for("aws").mode == "shadow" and policy_for("gcp").mode == "shadow"
    aws, _ = docs.cloud_node(instance_id="i-0aws")
    azure, _ = docs.cloud_node(cloud="azure", instance_id="vm-azure")
    signed_post(webhook, "aws", docs.aws_warning(instance_id="i-0aws"))
    signed_post(webhook, "azure", docs.azure_doc(resources=["vm-azure"], not_before=T0))
    assert dict(PreemptionNotice.objects.values_list("source", "mode")) == {"aws": "shadow", "azure": "prod"}


def test_staff_edit_the_mode_per_cloud_in_the_admin(client, model):
    from tests.factories import UserFactory

    staff = UserFactory(username="staffer", is_staff=True, is_superuser=True)
    client.force_login(staff)
    response = client.post(
        "/admin/preemption/preemptionpolicy/add/", {"source": "gcp", "mode": "prod", "drain_on_rebalance": "on"}
    )
    assert response.status_code == 302
    assert policy_for("gcp").mode == "prod" and policy_for("gcp").drain_on_rebalance is True
    for page in ("preemptionpolicy", "preemptionnotice", "shadowreclaim", "noticecount", "ondemandprice"):
        assert client.get(f"/admin/preemption/{page}/").status_code == 200
