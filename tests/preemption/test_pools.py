"""The interruption log per capacity pool: GET /api/v1/pools and the Insights page."""

from datetime import timedelta

import pytest
import time_machine
from django.utils import timezone

from nodes.models import Node, Reclaim
from nodes.services import pause_node, resume_node
from preemption.models import OnDemandPrice
from preemption.selectors import pool_stats
from rentals.services import start_rental
from tests.factories import make_ready_worker
from tests.preemption import docs
from tests.preemption.docs import T0, signed_post

pytestmark = pytest.mark.django_db


def _listed_for(node: Node, hours: float) -> None:
    """The node was listed `hours` ago and heartbeats still (observation window)."""
    Node.objects.filter(pk=node.pk).update(created_at=T0 - timedelta(hours=hours), last_seen_at=T0)


def test_pools_count_every_reclaim_but_a_rentals_start_and_measure_mtbi(owner_api, owner, renter, webhook, prod, model):
    a, _ = docs.cloud_node(instance_id="i-0a", provider=owner)
    b, _ = docs.cloud_node(instance_id="i-0b", provider=owner)
    quiet, _ = docs.cloud_node(instance_id="i-0q", zone="eu-west-1c", provider=owner)
    on_demand, _ = docs.cloud_node(instance_id="i-0od", is_spot=False, provider=owner)
    for node, hours in ((a, 100), (b, 50), (quiet, 10), (on_demand, 1000)):
        _listed_for(node, hours)
    with time_machine.travel(T0 - timedelta(days=40), tick=False):
        pause_node(node_id=a.pk)  # an owner's pause, 40 days ago: counted, but not in the last 30 days
    resume_node(node_id=a.pk)
    signed_post(webhook, "aws", docs.aws_warning(instance_id="i-0b", at=T0))  # a cloud's preemption
    make_ready_worker(a, model=model)
    start_rental(renter=renter, node_id=a.pk)  # drains a's worker: a rental_start reclaim, never counted
    assert Reclaim.objects.filter(node=a, trigger="rental_start").exists()

    response = owner_api.get("/api/v1/pools")
    assert response.status_code == 200
    pools = {(p["cloud"], p["instance_type"], p["zone"]): p for p in response.json()}
    busy = pools[("aws", "g5.xlarge", "eu-west-1b")]
    assert busy["interruptions"] == 2 and busy["interruptions_30d"] == 1
    assert busy["spot_node_hours"] == pytest.approx(150.0)  # on-demand hours are not spot hours
    assert busy["mtbi_hours"] == pytest.approx(75.0)
    assert busy["spot_nodes"] == 2 and busy["nodes"] == 3
    calm = pools[("aws", "g5.xlarge", "eu-west-1c")]
    assert calm["interruptions"] == 0 and calm["mtbi_hours"] is None and calm["spot_node_hours"] == pytest.approx(10.0)


def test_pools_need_a_signed_in_user(webhook):
    assert webhook.get("/api/v1/pools").status_code in (401, 403)


def test_pool_drains_clean_requests_cut_and_realised_discount(owner_api, owner, model):
    node, _ = docs.cloud_node(instance_id="i-0d", provider=owner, price_per_hour="1.20")
    OnDemandPrice.objects.create(cloud="aws", instance_type="g5.xlarge", price_per_hour="4.00")
    make_ready_worker(node, model=model)
    _, reclaim = pause_node(node_id=node.pk)
    from nodes.recovery import drain_tick

    drain_tick()  # nothing in flight: stopped, nothing cut
    [stats] = pool_stats()
    assert stats.drains_clean == 1 and stats.requests_cut == 0
    assert stats.realised_discount == pytest.approx(0.7)


def test_shadow_records_count_as_interruptions_of_their_pool(webhook, shadow, owner_api):
    docs.cloud_node(instance_id="i-0s")
    signed_post(webhook, "aws", docs.aws_warning(instance_id="i-0s", at=T0))
    [pool] = owner_api.get("/api/v1/pools").json()
    assert pool["interruptions"] == 1 and pool["shadow_interruptions"] == 1


def test_insights_page_draws_interruptions_per_day_over_30_days(client, owner, webhook, prod):
    node, _ = docs.cloud_node(instance_id="i-0chart", zone="<script>alert(1)</script>", provider=owner)
    _listed_for(node, 24)
    with time_machine.travel(T0 - timedelta(days=3), tick=False):
        pause_node(node_id=node.pk)
    resume_node(node_id=node.pk)
    signed_post(webhook, "aws", docs.aws_warning(instance_id="i-0chart", at=T0))
    [stats] = pool_stats(daily=True)
    assert len(stats.daily) == 30 and stats.daily[-1] == (T0.date(), 1) and stats.daily[-4] == ((T0 - timedelta(days=3)).date(), 1)
    client.force_login(owner)
    page = client.get("/insights/")
    assert page.status_code == 200
    html = page.content.decode()
    assert html.count('<rect class="bar"') == 30
    assert "Dec 01: 1 interruption" in html and "MTBI" in html
    assert "<script>alert(1)</script>" not in html  # a pool's name is escaped, in the chart too


def test_insights_page_needs_a_login(client):
    assert client.get("/insights/").status_code == 302
