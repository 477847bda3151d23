"""Rebalance is a soft signal; placement avoids at-risk nodes and freshly preempted pools (R3)."""

from datetime import timedelta

import pytest
import time_machine
from django.utils import timezone

from nodes.models import Reclaim, Worker, WorkerStatus
from nodes.placement import place_replacement, place_worker
from nodes.services import pause_node
from preemption.models import PreemptionPolicy
from tests.factories import make_ready_worker
from tests.preemption import docs
from tests.preemption.docs import T0, signed_post

pytestmark = pytest.mark.django_db


def test_rebalance_marks_the_node_at_risk_and_drains_nothing_by_default(webhook, prod, model):
    node, _ = docs.cloud_node(instance_id="i-0rebal")
    worker = make_ready_worker(node, model=model)
    reply = signed_post(webhook, "aws", docs.aws_rebalance(instance_id="i-0rebal", at=T0)).json()
    assert (reply["action"], reply["duplicate"]) == ("ignored", False)
    assert reply["notices"][0]["at_risk_until"] == "2026-12-01T08:45:00Z"  # 30 min by default
    node.refresh_from_db()
    worker.refresh_from_db()
    assert node.workload_enabled is True and worker.status == WorkerStatus.READY
    assert node.at_risk_until == T0 + timedelta(minutes=30)
    assert not Reclaim.objects.exists()
    pools = {(p["cloud"], p["zone"]): p for p in webhook_pools()}
    assert pools[("aws", "eu-west-1b")]["at_risk"] is True
    # The same signal again changes nothing.
    again = signed_post(webhook, "aws", docs.aws_rebalance(instance_id="i-0rebal", at=T0)).json()
    assert again["duplicate"] is True


def webhook_pools():
    from tests.conftest import client_for
    from tests.factories import UserFactory

    return client_for(UserFactory()).get("/api/v1/pools").json()


def test_placement_avoids_an_at_risk_node_until_the_mark_clears_by_itself(webhook, prod, model):
    node, _ = docs.cloud_node(instance_id="i-0risk")
    signed_post(webhook, "aws", docs.aws_rebalance(instance_id="i-0risk", at=T0))
    assert place_worker(node) is None
    later = T0 + timedelta(minutes=30, seconds=1)
    with time_machine.travel(later, tick=False):
        node.last_seen_at = timezone.now()
        node.save(update_fields=["last_seen_at"])
        assert place_worker(node) is not None  # no terminate followed: the mark is gone
        assert webhook_pools()[0]["at_risk"] is False


def test_drain_on_rebalance_is_an_option_per_cloud(webhook, prod, model):
    PreemptionPolicy.objects.create(source="aws", drain_on_rebalance=True)
    node, _ = docs.cloud_node(instance_id="i-0drainreb")
    make_ready_worker(node, model=model)
    reply = signed_post(webhook, "aws", docs.aws_rebalance(instance_id="i-0drainreb", at=T0)).json()
    assert reply["action"] == "reclaimed"
    reclaim = Reclaim.objects.get(node=node)
    assert reclaim.trigger == "preemption" and reclaim.deadline == T0 + timedelta(seconds=120)  # no notice time: the ceiling


def test_rebalance_in_shadow_marks_nothing(webhook, shadow, model):
    node, _ = docs.cloud_node(instance_id="i-0shreb")
    reply = signed_post(webhook, "aws", docs.aws_rebalance(instance_id="i-0shreb", at=T0)).json()
    assert reply["action"] == "ignored" and reply["notices"][0]["at_risk_until"] == "2026-12-01T08:45:00Z"
    node.refresh_from_db()
    assert node.at_risk_until is None and place_worker(node) is not None


def test_r3_placement_avoids_a_pool_for_three_minutes_after_a_preemption(webhook, prod, model):
    victim, _ = docs.cloud_node(instance_id="i-0victim")
    neighbour, _ = docs.cloud_node(instance_id="i-0neighbour")  # same pool: aws / g5.xlarge / eu-west-1b
    elsewhere, _ = docs.cloud_node(instance_id="i-0elsewhere", zone="eu-west-1c")
    on_demand, _ = docs.cloud_node(instance_id="i-0ondemand", is_spot=False)
    signed_post(webhook, "aws", docs.aws_warning(instance_id="i-0victim", at=T0))
    assert place_worker(neighbour) is None
    assert place_worker(elsewhere) is not None
    assert place_worker(on_demand) is not None  # on-demand capacity is not what the cloud reclaims
    with time_machine.travel(T0 + timedelta(minutes=3, seconds=1), tick=False):
        neighbour.last_seen_at = timezone.now()
        neighbour.save(update_fields=["last_seen_at"])
        assert place_worker(neighbour) is not None


def test_r3_an_owner_pause_does_not_make_placement_avoid_the_pool(prod, model):
    paused, _ = docs.cloud_node(instance_id="i-0paused")
    neighbour, _ = docs.cloud_node(instance_id="i-0nb")
    pause_node(node_id=paused.pk)
    assert place_worker(neighbour) is not None


def test_r3_warm_replacement_skips_the_preempted_pool(webhook, prod, model):
    victim, _ = docs.cloud_node(instance_id="i-0v")
    make_ready_worker(victim, model=model)
    same_pool, _ = docs.cloud_node(instance_id="i-0same", price_per_hour="0.10")
    other_pool, _ = docs.cloud_node(instance_id="i-0other", zone="eu-west-1a", price_per_hour="0.90")
    signed_post(webhook, "aws", docs.aws_warning(instance_id="i-0v", at=T0))
    # The replacement task ran on commit in production; here it is called directly.
    Worker.objects.filter(node__in=[same_pool, other_pool]).delete()
    worker = place_replacement(model_id=model.pk, instead_of_node_id=victim.pk)
    assert worker is not None and worker.node_id == other_pool.pk
