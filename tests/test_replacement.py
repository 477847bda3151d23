"""R3 warm replacements: capacity comes back while the old worker drains."""

import pytest

from nodes.models import NodeEvent, Worker, WorkerStatus
from nodes.placement import choose_model, place_replacement
from nodes.services import pause_node
from nodes.slots import acquire_slot, router_heartbeat
from tests.factories import ServedModelFactory, make_node, make_ready_worker

pytestmark = pytest.mark.django_db


def test_r3_reclaiming_the_only_spot_worker_starts_one_on_demand_before_it_stops(
    owner, model, django_capture_on_commit_callbacks
):
    spot, _ = make_node(provider=owner, is_spot=True, cloud="aws", instance_type="g5", zone="a")
    worker = make_ready_worker(spot, model=model)
    router_heartbeat(instance_id="r1")
    acquire_slot(worker_id=worker.pk, router_instance="r1")  # a request keeps it draining
    other_spot, _ = make_node(provider=owner, is_spot=True, cloud="aws", instance_type="g5", zone="b", price_per_hour="0.10")
    on_demand, _ = make_node(provider=owner, is_spot=False, cloud="aws", instance_type="g5", zone="a", price_per_hour="9.00")

    with django_capture_on_commit_callbacks(execute=True):
        pause_node(node_id=spot.pk)

    worker.refresh_from_db()
    assert worker.status == WorkerStatus.DRAINING  # the old one still drains...
    replacement = Worker.objects.get(node=on_demand)  # ...and the new one is on its way
    assert replacement.status == WorkerStatus.STARTING and replacement.model == model
    assert not Worker.objects.filter(node=other_spot).exists()
    assert NodeEvent.objects.get(kind="warm_replacement").data["instead_of_node"] == spot.pk


def test_r3_replacement_prefers_another_capacity_pool_among_spot_nodes(owner, model):
    origin, _ = make_node(provider=owner, is_spot=True, cloud="aws", instance_type="g5", zone="a")
    same_pool, _ = make_node(provider=owner, is_spot=True, cloud="aws", instance_type="g5", zone="a", price_per_hour="0.1")
    other_pool, _ = make_node(provider=owner, is_spot=True, cloud="gcp", instance_type="a2", zone="c", price_per_hour="5")
    worker = place_replacement(model_id=model.pk, instead_of_node_id=origin.pk)
    assert worker.node_id == other_pool.pk
    assert not Worker.objects.filter(node=same_pool).exists()


def test_r3_replacement_respects_placement_rules(owner, renter, model):
    from rentals.services import start_rental

    origin, _ = make_node(provider=owner, is_spot=True)
    rented, _ = make_node(provider=owner)
    start_rental(renter=renter, node_id=rented.pk)
    make_node(provider=owner, online=False)
    small, _ = make_node(provider=owner, vram_gb=8)
    assert place_replacement(model_id=model.pk, instead_of_node_id=origin.pk) is None
    assert not Worker.objects.exists()
    assert small.vram_gb < model.min_vram_gb


def test_r3_on_demand_floor_comes_first_on_on_demand_nodes(owner):
    popular = ServedModelFactory(name="a-popular", target_replicas=10)
    floored = ServedModelFactory(name="b-floored", target_replicas=1, min_on_demand_replicas=1)
    spot_node, _ = make_node(provider=owner, is_spot=True)
    make_ready_worker(spot_node, model=floored)  # at target, but on spot: the floor is unmet
    on_demand, _ = make_node(provider=owner, is_spot=False)
    assert choose_model(on_demand) == floored
    another_spot, _ = make_node(provider=owner, is_spot=True)
    assert choose_model(another_spot) == popular
