"""R3: every path that can put a model on a node goes through place_worker, which refuses fast."""

from datetime import timedelta

import pytest
from django.utils import timezone

from nodes import placement
from nodes.heartbeats import hello
from nodes.models import Command, Node, Worker, WorkerStatus
from nodes.recovery import place_missing_workers
from nodes.services import pause_node
from rentals.services import end_rental, start_rental
from tests.factories import ServedModelFactory, make_node, make_ready_worker

pytestmark = pytest.mark.django_db


@pytest.fixture
def placements(monkeypatch):
    """Records every call of place_worker on each path, still running the real function."""
    calls = []
    real = placement.place_worker

    def spy(node, **kwargs):
        calls.append(node if isinstance(node, int) else node.pk)
        return real(node, **kwargs)

    for module in ("nodes.placement", "nodes.services", "nodes.heartbeats", "nodes.recovery", "rentals.services"):
        monkeypatch.setattr(f"{module}.place_worker", spy)
    return calls


def test_r3_place_worker_starts_one_worker_with_a_start_command(owner, model):
    node, _ = make_node(provider=owner)
    worker = placement.place_worker(node)
    assert worker.status == WorkerStatus.STARTING and worker.model == model
    command = Command.objects.get(kind="start_worker")
    assert command.payload == {"worker_id": str(worker.pk), "model": model.name}
    assert placement.place_worker(node) is None  # a live worker exists


def test_r3_place_worker_places_nothing_when_workload_off(owner, model):
    node, _ = make_node(provider=owner, is_spot=True)
    pause_node(node_id=node.pk)
    assert placement.place_worker(node) is None
    assert not Worker.objects.exists()


def test_r3_place_worker_places_nothing_on_rented_node(owner, renter, model):
    node, _ = make_node(provider=owner)
    start_rental(renter=renter, node_id=node.pk)
    assert placement.place_worker(node) is None
    assert not Worker.objects.exists()


def test_r3_place_worker_places_nothing_on_offline_node(owner, model):
    node, _ = make_node(provider=owner, online=False)
    assert placement.place_worker(node) is None
    Node.objects.filter(pk=node.pk).update(last_seen_at=timezone.now() - timedelta(seconds=31))
    assert placement.place_worker(node) is None


def test_r3_place_worker_places_nothing_when_a_draining_worker_remains(owner, model):
    node, _ = make_node(provider=owner, is_spot=True)
    worker = make_ready_worker(node, model=model)
    Worker.objects.filter(pk=worker.pk).update(status=WorkerStatus.DRAINING)
    assert placement.place_worker(node) is None


def test_r3_place_worker_chooses_the_fitting_model_furthest_below_target(owner):
    small = ServedModelFactory(name="small", min_vram_gb=8, target_replicas=1)
    big = ServedModelFactory(name="big", min_vram_gb=200, target_replicas=5)
    node_a, _ = make_node(provider=owner, vram_gb=24)
    assert placement.place_worker(node_a).model == small
    tiny = ServedModelFactory(name="tiny", min_vram_gb=4, target_replicas=3)
    node_b, _ = make_node(provider=owner, vram_gb=24)
    assert placement.place_worker(node_b).model == tiny  # small already at its target
    assert big.workers.count() == 0


def test_r3_rental_end_goes_through_place_worker(owner, renter, model, placements):
    node, _ = make_node(provider=owner)
    rental = start_rental(renter=renter, node_id=node.pk)
    end_rental(rental_id=rental.pk, reason="renter")
    assert node.pk in placements
    assert Worker.objects.filter(node=node, status=WorkerStatus.STARTING).count() == 1


def test_r3_recovery_goes_through_place_worker(owner, model, placements):
    node, _ = make_node(provider=owner)
    assert place_missing_workers() == 1
    assert placements == [node.pk]
    assert place_missing_workers() == 0


def test_r3_hello_after_reboot_goes_through_place_worker(owner, model, placements):
    node, _ = make_node(provider=owner, online=False)
    old = make_ready_worker(node, model=model)
    reply = hello(node=node, hardware={"gpu_model": "H100", "gpu_count": 8, "vram_gb": 80}, cloud={})
    assert node.pk in placements
    old.refresh_from_db()
    assert old.status == WorkerStatus.LOST  # the rebooted agent no longer runs it
    assert [c["kind"] for c in reply["commands"]] == ["start_worker"]
    node.refresh_from_db()
    assert (node.gpu_model, node.gpu_count) == ("H100", 8)


def test_r3_hello_keeps_workers_the_agent_still_runs(owner, model):
    node, _ = make_node(provider=owner)
    worker = make_ready_worker(node, model=model)
    reply = hello(node=node, hardware={}, cloud={}, running_worker_ids=[str(worker.pk)])
    worker.refresh_from_db()
    assert worker.status == WorkerStatus.READY
    assert reply["commands"] == []
