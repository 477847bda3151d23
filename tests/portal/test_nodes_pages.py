"""My nodes: states, live rows, Pause with its preview, Available, the spot toggle (R10), Add a node."""

from datetime import UTC, datetime
from html import unescape

import pytest
import time_machine
from django.utils import timezone

from nodes.models import Node, Reclaim, WorkerStatus
from nodes.services import pause_node
from nodes.slots import acquire_slot, release_slot, router_heartbeat
from nodes.tokens import hash_token
from rentals.services import start_rental
from tests.factories import make_node, make_ready_worker
from tests.portal.conftest import HTMX

pytestmark = pytest.mark.django_db

T0 = datetime(2026, 11, 30, 12, 0, 0, tzinfo=UTC)


def busy_spot_node(owner, model, name="gpu-a"):
    """A spot node whose ready worker holds one router slot: one request in flight."""
    node, _ = make_node(provider=owner, is_spot=True, name=name)
    worker = make_ready_worker(node, model=model)
    router_heartbeat(instance_id="r1")
    slot = acquire_slot(worker_id=worker.pk, router_instance="r1")
    assert slot is not None
    return node, worker, slot


def html(response) -> str:
    return response.content.decode()


def test_anonymous_is_sent_to_log_in(client):
    response = client.get("/nodes/")
    assert response.status_code == 302 and response["Location"].startswith("/accounts/login/?next=/nodes/")


def test_list_shows_each_state_pool_price_spot_and_worker_load(owner, renter, model, owner_web):
    available, _ = make_node(provider=owner, name="n-available", cloud="aws", instance_type="g5.xlarge", zone="us-east-1a", price_per_hour="2.25")
    make_ready_worker(available, model=model)
    paused, _ = make_node(provider=owner, name="n-paused", is_spot=True)
    pause_node(node_id=paused.pk)
    make_node(provider=owner, name="n-offline", online=False)
    rented, _ = make_node(provider=owner, name="n-rented")
    start_rental(renter=renter, node_id=rented.pk)
    busy_spot_node(owner, model, name="n-draining")
    pause_node(node_id=Node.objects.get(name="n-draining").pk)

    body = html(owner_web.get("/nodes/"))

    for label in ("Available", "Paused", "Offline", "Rented", "Draining"):
        assert f">{label}</span>" in body
    assert "1 request in flight</span>, stops in" in body
    assert "aws" in body and "g5.xlarge" in body and "us-east-1a" in body
    assert "$2.25/h" in body
    assert "llama-3-8b · ready" in body and "0/8" in body
    assert "llama-3-8b · draining" in body and "1/8" in body


def test_row_polls_only_while_its_node_changes(owner, model, owner_web, django_capture_on_commit_callbacks):
    node, worker, slot = busy_spot_node(owner, model)
    idle, _ = make_node(provider=owner, is_spot=True, name="idle")
    pause_node(node_id=node.pk)

    body = html(owner_web.get("/nodes/"))
    draining_row = body[body.index(f'id="node-{node.pk}"') - 5 : body.index(f'id="node-{idle.pk}"')]
    idle_row = body[body.index(f'id="node-{idle.pk}"') - 5 :]
    assert 'hx-trigger="every 1s"' in draining_row
    assert "hx-trigger" not in idle_row.split("</tr>")[0].split(">")[0]

    with django_capture_on_commit_callbacks(execute=True):
        release_slot(slot_id=slot.pk, worker_id=worker.pk)  # the last request ends: the drain finishes
    row = owner_web.get(f"/nodes/{node.pk}/row/", **HTMX)
    assert row.status_code == 200
    assert ">Paused</span>" in html(row)
    assert "hx-trigger" not in html(row)  # nothing changes any more: the row stops polling


def test_row_of_a_rental_being_reclaimed_polls_slowly_until_it_ends(owner, renter, owner_web):
    node, _ = make_node(provider=owner, is_spot=True)
    start_rental(renter=renter, node_id=node.pk)
    pause_node(node_id=node.pk)
    row = html(owner_web.get(f"/nodes/{node.pk}/row/", **HTMX))
    assert ">Paused</span>" in row and "Rental ends in" in row
    assert 'hx-trigger="every 5s"' in row  # the countdown ticks in the browser; the poll only sees the end


def test_row_poll_answers_204_while_nothing_changed(owner, model, owner_web):
    node, _, _ = busy_spot_node(owner, model)
    pause_node(node_id=node.pk)
    first = html(owner_web.get(f"/nodes/{node.pk}/row/", **HTMX))
    seen = first.split("?seen=")[1].split('"')[0]
    assert owner_web.get(f"/nodes/{node.pk}/row/?seen={seen}", **HTMX).status_code == 204
    assert owner_web.get(f"/nodes/{node.pk}/row/?seen=stale", **HTMX).status_code == 200


def test_pause_shows_what_it_will_do_before_it_does_it(owner, renter, model, owner_web):
    node, _, _ = busy_spot_node(owner, model)
    rented, _ = make_node(provider=owner, is_spot=True, name="rented")
    start_rental(renter=renter, node_id=rented.pk)

    with time_machine.travel(T0, tick=False):
        page = owner_web.get(f"/nodes/{node.pk}/pause/")
        rented_page = owner_web.get(f"/nodes/{rented.pk}/pause/", **HTMX)

    assert page.status_code == 200
    assert "1 request in flight will finish or be cut by 12:02:00 UTC" in html(page)
    assert ">Pause now</button>" in html(page)
    assert "No request is in flight; 1 rental gets two minutes' notice (until 12:02:00 UTC)" in unescape(html(rented_page))
    assert html(rented_page).lstrip().startswith(f'<tr id="node-{rented.pk}" class="confirm-row"')
    # Looking is not doing.
    assert Node.objects.get(pk=node.pk).workload_enabled and not Reclaim.objects.exists()


def test_pause_post_without_js_pauses_and_redirects(owner, model, owner_web):
    node, worker, _ = busy_spot_node(owner, model)
    response = owner_web.post(f"/nodes/{node.pk}/pause/")
    assert response.status_code == 302 and response["Location"] == "/nodes/"
    worker.refresh_from_db()
    assert worker.status == WorkerStatus.DRAINING
    assert not Node.objects.get(pk=node.pk).workload_enabled
    follow = html(owner_web.get("/nodes/"))
    assert "is draining: 1 request in flight finishes or is cut by" in follow


def test_pause_with_htmx_returns_the_draining_row_and_the_message(owner, model, owner_web):
    node, _, _ = busy_spot_node(owner, model)
    response = owner_web.post(f"/nodes/{node.pk}/pause/", **HTMX)
    assert response.status_code == 200
    body = html(response)
    assert f'<tr id="node-{node.pk}"' in body and ">Draining</span>" in body and "1 request in flight" in body
    assert 'id="messages" class="messages" aria-live="polite" hx-swap-oob="true"' in body


def test_pause_redirects_to_a_safe_next_only(owner, owner_web):
    node, _ = make_node(provider=owner, is_spot=True)
    ok = owner_web.post(f"/nodes/{node.pk}/pause/", {"next": f"/nodes/{node.pk}/"})
    assert ok["Location"] == f"/nodes/{node.pk}/"
    owner_web.post(f"/nodes/{node.pk}/resume/")
    evil = owner_web.post(f"/nodes/{node.pk}/pause/", {"next": "https://evil.example/"})
    assert evil["Location"] == "/nodes/"


def test_pause_on_an_on_demand_node_is_a_409_message_not_a_500(owner, model, owner_web):
    node, _ = make_node(provider=owner, is_spot=False)
    make_ready_worker(node, model=model)
    body = html(owner_web.get("/nodes/"))
    assert "Only spot nodes pause" in body  # the button is disabled and says why

    forged = owner_web.post(f"/nodes/{node.pk}/pause/")
    assert forged.status_code == 409
    assert "Only a spot node can be paused" in html(forged)
    forged_htmx = owner_web.post(f"/nodes/{node.pk}/pause/", **HTMX)
    assert forged_htmx.status_code == 409
    assert "Only a spot node can be paused" in html(forged_htmx) and f'id="node-{node.pk}"' in html(forged_htmx)
    assert Node.objects.get(pk=node.pk).workload_enabled


def test_available_turns_workload_back_on(owner, owner_web):
    node, _ = make_node(provider=owner, is_spot=True)
    pause_node(node_id=node.pk)
    assert ">Available</button>" in html(owner_web.get("/nodes/"))
    response = owner_web.post(f"/nodes/{node.pk}/resume/", **HTMX)
    assert response.status_code == 200 and ">Available</span>" in html(response)
    assert Node.objects.get(pk=node.pk).workload_enabled
    assert owner_web.post(f"/nodes/{node.pk}/resume/").status_code == 302  # idempotent


def test_spot_toggle_changes_an_idle_node(owner, owner_web):
    node, _ = make_node(provider=owner, is_spot=False)
    response = owner_web.post(f"/nodes/{node.pk}/spot/", {"is_spot": "true"}, **HTMX)
    assert response.status_code == 200 and ">Spot</span>" in html(response)
    assert Node.objects.get(pk=node.pk).is_spot is True
    assert owner_web.post(f"/nodes/{node.pk}/spot/", {"is_spot": "false"}).status_code == 302
    assert Node.objects.get(pk=node.pk).is_spot is False


def test_r10_spot_toggle_is_disabled_on_a_rented_node_and_says_why(owner, renter, owner_web):
    node, _ = make_node(provider=owner, is_spot=True)
    start_rental(renter=renter, node_id=node.pk)
    body = html(owner_web.get("/nodes/"))
    assert f'id="spot-{node.pk}" disabled aria-describedby="spot-why-{node.pk}"' in body
    assert "Locked while rented" in body
    assert "Locked while rented" in html(owner_web.get(f"/nodes/{node.pk}/"))


def test_r10_forged_spot_toggle_on_a_rented_node_is_refused_by_the_server(owner, renter, owner_web):
    node, _ = make_node(provider=owner, is_spot=True)
    start_rental(renter=renter, node_id=node.pk)

    forged = owner_web.post(f"/nodes/{node.pk}/spot/", {"is_spot": "false"})
    assert forged.status_code == 409
    assert "The spot flag cannot change while the node is rented." in html(forged)
    forged_htmx = owner_web.post(f"/nodes/{node.pk}/spot/", {"is_spot": "false"}, **HTMX)
    assert forged_htmx.status_code == 409
    assert "The spot flag cannot change while the node is rented." in html(forged_htmx)
    assert Node.objects.get(pk=node.pk).is_spot is True


def test_spot_toggle_rejects_a_malformed_value(owner, owner_web):
    node, _ = make_node(provider=owner, is_spot=True)
    assert owner_web.post(f"/nodes/{node.pk}/spot/", {"is_spot": "maybe"}).status_code == 400
    assert owner_web.get(f"/nodes/{node.pk}/spot/").status_code == 405


@pytest.mark.parametrize("who", ["renter_web", "outsider_web"])
def test_r14_only_the_owner_sees_and_changes_a_node(who, owner, renter, request):
    node, _ = make_node(provider=owner, is_spot=True)
    web = request.getfixturevalue(who)
    for url in (f"/nodes/{node.pk}/", f"/nodes/{node.pk}/row/", f"/nodes/{node.pk}/pause/"):
        assert web.get(url).status_code == 404
    assert web.post(f"/nodes/{node.pk}/pause/").status_code == 404
    assert web.post(f"/nodes/{node.pk}/resume/").status_code == 404
    assert web.post(f"/nodes/{node.pk}/spot/", {"is_spot": "false"}).status_code == 404
    assert node.name not in html(web.get("/nodes/"))
    node.refresh_from_db()
    assert node.workload_enabled and node.is_spot


def test_add_a_node_shows_its_agent_token_once_with_the_agent_command(owner, owner_web):
    assert owner_web.get("/nodes/new/").status_code == 200
    response = owner_web.post("/nodes/new/", {"name": "rig-1", "is_spot": "on", "price_per_hour": "0.90", "gpu_model": "RTX 4090"})
    assert response.status_code == 201
    assert response["Cache-Control"].startswith("max-age=0") and "no-store" in response["Cache-Control"]
    body = html(response)
    node = Node.objects.get(provider=owner, name="rig-1")
    assert node.is_spot and node.gpu_model == "RTX 4090" and str(node.price_per_hour) == "0.9000"
    token = body.split('<code id="agent-token">')[1].split("</code>")[0]
    assert node.agent_token_hash == hash_token(token)
    assert f"python -m simulator.agent --server http://testserver --token {token}" in body
    # Never again: the node's pages do not carry it.
    assert token not in html(owner_web.get(f"/nodes/{node.pk}/")) and token not in html(owner_web.get("/nodes/"))


def test_add_a_node_with_bad_input_is_400_and_creates_nothing(owner, owner_web):
    response = owner_web.post("/nodes/new/", {"name": "", "price_per_hour": "-1"})
    assert response.status_code == 400
    assert not Node.objects.filter(provider=owner).exists()


def test_detail_shows_workers_slots_and_every_reclaim_as_a_timeline(owner, model, owner_web):
    node, worker, slot = busy_spot_node(owner, model)
    live = html(owner_web.get(f"/nodes/{node.pk}/"))
    assert str(worker.pk)[:8] in live and "r1" in live  # the worker and its slot's router
    assert "No reclaim yet." in live

    with time_machine.travel(T0, tick=False):
        pause_node(node_id=node.pk)
    draining = owner_web.get(f"/nodes/{node.pk}/")
    assert 'hx-trigger="every 1s"' in html(draining)  # the page body refreshes while it drains
    assert "Owner paused the node" in html(draining) and "Running: deadline" in html(draining)

    from nodes.drain import finish_drain

    with time_machine.travel(T0 + timezone.timedelta(seconds=120), tick=False):
        assert finish_drain(worker.pk) is True  # the deadline passed with the request still running
    body = html(owner_web.get(f"/nodes/{node.pk}/"))
    assert "Finished after 2:00" in body and "1 request cut" in body
    assert "stopped at the deadline: 1 request cut" in body
    assert "Drain started: 1 worker, 1 request in flight" in body
    assert "+0:00" in body and "+2:00" in body
    assert "every 1s" not in body


def test_detail_timeline_of_a_drain_that_finished_in_time(owner, model, owner_web, django_capture_on_commit_callbacks):
    node, worker, slot = busy_spot_node(owner, model)
    pause_node(node_id=node.pk)
    with django_capture_on_commit_callbacks(execute=True):
        release_slot(slot_id=slot.pk, worker_id=worker.pk)
    body = html(owner_web.get(f"/nodes/{node.pk}/"))
    assert "stopped after its last request finished" in body
    assert "nothing was cut" in body and "Reclaim finished" in body


def test_detail_draws_in_flight_over_time_from_the_request_log(owner, model, owner_web):
    from inference.models import RequestLog

    node, worker, slot = busy_spot_node(owner, model)
    with time_machine.travel(T0, tick=False):
        pause_node(node_id=node.pk)
    RequestLog.objects.create(
        request_id="req-1", model=model.name, worker_id=worker.pk, node_id=node.pk, outcome="completed",
        admitted_at=T0 - timezone.timedelta(seconds=5), created_at=T0 - timezone.timedelta(seconds=5), duration_ms=35_000,
    )
    release_slot(slot_id=slot.pk, worker_id=worker.pk)
    from nodes.models import Reclaim as R

    R.objects.filter(node=node).update(finished_at=T0 + timezone.timedelta(seconds=30))
    body = html(owner_web.get(f"/nodes/{node.pk}/"))
    assert 'class="spark" role="img" aria-label="1 at +0 s' in body
    assert "0 at +30 s" in body
