"""R11: reputation counts how rentals ended, and never blames a provider for a spot reclaim."""

from datetime import timedelta

import pytest
from django.utils import timezone
from hypothesis import HealthCheck, given, settings as hsettings, strategies as st

from nodes.services import set_spot
from rentals.models import EndReason, Rental, RentalStatus
from rentals.services import end_rental, start_rental
from reputation.models import NodeReputation, ProviderReputation, Standing, StandingChange
from reputation.scoring import smoothed
from reputation.services import recompute_all, set_standing
from tests.factories import UserFactory, make_node

pytestmark = pytest.mark.django_db

MOVES = {  # end reason -> (successes, failures) for a non-spot rental
    EndReason.RENTER: (1, 0),
    EndReason.TERM: (1, 0),
    EndReason.PROVIDER: (0, 1),
    EndReason.NODE_LOST: (0, 1),
    EndReason.SPOT_RECLAIM: (0, 0),
}


def ended(node, renter, *, is_spot: bool, reason: str, days_ago: float = 1) -> Rental:
    when = timezone.now() - timedelta(days=days_ago)
    return Rental.objects.create(
        node=node, renter=renter, is_spot=is_spot, status=RentalStatus.ENDED,
        started_at=when - timedelta(hours=1), ended_at=when, end_reason=reason,
    )


@pytest.mark.parametrize("reason", list(MOVES))
@pytest.mark.parametrize("is_spot", [False, True])
def test_r11_matrix_each_end_reason_and_spot_flag(owner, renter, reason, is_spot):
    node, _ = make_node(provider=owner, is_spot=is_spot)
    ended(node, renter, is_spot=is_spot, reason=reason)
    recompute_all()
    node_rep = NodeReputation.objects.get(node=node)
    provider_rep = ProviderReputation.objects.get(provider=owner)
    expected = (0, 0) if is_spot else MOVES[reason]
    for rep in (node_rep, provider_rep):
        assert (rep.successes, rep.failures) == expected
        assert rep.spot_left_out == (1 if is_spot else 0)
        assert rep.score == pytest.approx(smoothed(*expected))


def test_r11_score_moves_when_a_rental_ends_through_the_service(owner, renter, django_capture_on_commit_callbacks):
    node, _ = make_node(provider=owner)
    rental = start_rental(renter=renter, node_id=node.pk)
    with django_capture_on_commit_callbacks(execute=True):
        end_rental(rental_id=rental.pk, reason=EndReason.PROVIDER)
    rep = ProviderReputation.objects.get(provider=owner)
    assert rep.failures == 1 and rep.score == pytest.approx(smoothed(0, 1))
    assert NodeReputation.objects.get(node=node).failures == 1


def test_r11_spot_flag_is_the_one_at_the_rental_start(owner, renter, django_capture_on_commit_callbacks):
    on_demand_then_spot, _ = make_node(provider=owner, is_spot=False)
    spot_then_on_demand, _ = make_node(provider=owner, is_spot=True)
    first = start_rental(renter=renter, node_id=on_demand_then_spot.pk)
    second = start_rental(renter=UserFactory(), node_id=spot_then_on_demand.pk)
    with django_capture_on_commit_callbacks(execute=True):
        end_rental(rental_id=first.pk, reason=EndReason.PROVIDER)
        end_rental(rental_id=second.pk, reason=EndReason.PROVIDER)
    set_spot(node_id=on_demand_then_spot.pk, is_spot=True)
    set_spot(node_id=spot_then_on_demand.pk, is_spot=False)
    recompute_all()
    assert NodeReputation.objects.get(node=on_demand_then_spot).failures == 1  # still counts
    assert NodeReputation.objects.get(node=spot_then_on_demand).failures == 0  # still left out
    assert NodeReputation.objects.get(node=spot_then_on_demand).spot_left_out == 1
    assert ProviderReputation.objects.get(provider=owner).failures == 1


def test_r11_rentals_outside_the_window_do_not_count(owner, renter):
    node, _ = make_node(provider=owner)
    ended(node, renter, is_spot=False, reason=EndReason.PROVIDER, days_ago=91)
    ended(node, renter, is_spot=False, reason=EndReason.RENTER, days_ago=89)
    recompute_all()
    rep = NodeReputation.objects.get(node=node)
    assert (rep.successes, rep.failures) == (1, 0)


reasons = st.sampled_from([r.value for r in EndReason])


@hsettings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(counted=st.lists(st.tuples(st.integers(0, 2), reasons), max_size=8), spot=st.lists(st.tuples(st.integers(0, 2), reasons), min_size=1, max_size=8))
def test_r11_property_spot_rentals_never_change_either_score(counted, spot):
    Rental.objects.all().delete()
    owners = [UserFactory(), UserFactory()]
    nodes = [make_node(provider=owners[i % 2])[0] for i in range(3)]
    renter = UserFactory()
    for node_index, reason in counted:
        ended(nodes[node_index], renter, is_spot=False, reason=reason)
    recompute_all()
    before = sorted(NodeReputation.objects.filter(node__in=nodes).values_list("node_id", "score", "successes", "failures"))
    before_p = sorted(ProviderReputation.objects.filter(provider__in=owners).values_list("provider_id", "score", "successes", "failures"))
    for node_index, reason in spot:
        ended(nodes[node_index], renter, is_spot=True, reason=reason)
    recompute_all()
    after = sorted(NodeReputation.objects.filter(node__in=nodes).values_list("node_id", "score", "successes", "failures"))
    after_p = sorted(ProviderReputation.objects.filter(provider__in=owners).values_list("provider_id", "score", "successes", "failures"))
    assert after == before and after_p == before_p


def test_r11_delisting_hides_the_providers_nodes_and_reinstating_brings_them_back(owner, renter, renter_api, settings):
    settings.REPUTATION_DELIST_MIN_RENTALS = 3
    node, _ = make_node(provider=owner)
    for _ in range(5):
        ended(node, renter, is_spot=False, reason=EndReason.PROVIDER)
    assert recompute_all()["delisted"] == 0  # 9/15 = 0.60: the prior still holds it at the line
    ended(node, renter, is_spot=False, reason=EndReason.PROVIDER)
    assert [o["id"] for o in renter_api.get("/api/v1/offers").json()] == [node.pk]
    report = recompute_all()
    assert report["delisted"] == 1
    rep = ProviderReputation.objects.get(provider=owner)
    assert rep.standing == Standing.DELISTED
    assert renter_api.get("/api/v1/offers").json() == []
    change = StandingChange.objects.get()
    assert change.changed_by is None and "below" in change.reason

    staff = UserFactory(is_staff=True)
    set_standing(provider_id=owner.pk, standing=Standing.LISTED, by=staff, reason="provider fixed the PSU")
    recompute_all()  # still below the threshold, but no new failure since reinstatement
    assert ProviderReputation.objects.get(provider=owner).standing == Standing.LISTED
    assert [o["id"] for o in renter_api.get("/api/v1/offers").json()] == [node.pk]
    assert StandingChange.objects.filter(changed_by=staff, reason="provider fixed the PSU").exists()
    ended(node, renter, is_spot=False, reason=EndReason.PROVIDER, days_ago=0)
    assert recompute_all()["delisted"] == 1


def test_r11_offers_carry_reliability_or_null(owner, renter, renter_api):
    scored, _ = make_node(provider=owner)
    fresh, _ = make_node(provider=owner)
    ended(scored, renter, is_spot=False, reason=EndReason.RENTER)
    recompute_all()
    reliability = {o["id"]: o["reliability"] for o in renter_api.get("/api/v1/offers").json()}
    assert reliability[scored.pk] == pytest.approx(smoothed(1, 0))
    assert reliability[fresh.pk] is None


def test_r11_provider_sees_own_score_and_what_moved_it(owner, renter, owner_api):
    node, _ = make_node(provider=owner)
    ended(node, renter, is_spot=False, reason=EndReason.PROVIDER)
    ended(node, renter, is_spot=True, reason=EndReason.SPOT_RECLAIM)
    recompute_all()
    body = owner_api.get("/api/v1/reputation").json()
    assert body["failures"] == 1 and body["spot_left_out"] == 1
    assert sorted(r["counts_as"] for r in body["rentals"]) == ["failure", "left_out"]


def test_r11_staff_endpoints_refuse_non_staff(owner_api, owner):
    assert owner_api.get("/api/v1/staff/providers").status_code == 403
    response = owner_api.post(f"/api/v1/staff/providers/{owner.pk}/delist", {"reason": "x"}, format="json")
    assert response.status_code == 403
    assert not StandingChange.objects.exists()


def test_r11_staff_delists_and_reinstates_with_reason(owner):
    from tests.conftest import client_for

    staff = UserFactory(is_staff=True)
    api = client_for(staff)
    assert api.post(f"/api/v1/staff/providers/{owner.pk}/delist", {}, format="json").status_code == 400
    body = api.post(f"/api/v1/staff/providers/{owner.pk}/delist", {"reason": "fraud report"}, format="json").json()
    assert body["standing"] == "delisted"
    body = api.post(f"/api/v1/staff/providers/{owner.pk}/reinstate", {"reason": "cleared"}, format="json").json()
    assert body["standing"] == "listed"
    assert list(StandingChange.objects.order_by("at").values_list("standing", "reason", "changed_by")) == [
        ("delisted", "fraud report", staff.pk), ("listed", "cleared", staff.pk)
    ]
    listing = api.get("/api/v1/staff/providers").json()
    assert listing[0]["provider"] == owner.pk


def test_r11_portal_my_reputation_page_shows_score_and_what_moved_it(owner, renter, client):
    node, _ = make_node(provider=owner)
    ended(node, renter, is_spot=False, reason=EndReason.PROVIDER)
    ended(node, renter, is_spot=True, reason=EndReason.SPOT_RECLAIM)
    recompute_all()
    client.force_login(owner)
    page = client.get("/reputation/").content.decode()
    assert "Score 0.82" in page and "1 spot rental left out" in page
    assert "failure" in page and "left out" in page


def test_r11_portal_staff_delists_and_reinstates_with_a_reason(owner, client):
    make_node(provider=owner)  # the staff page lists providers, people with nodes
    staff = UserFactory(is_staff=True)
    client.force_login(staff)
    assert client.post(f"/staff/providers/{owner.pk}/standing/", {"standing": "delisted", "reason": ""}).status_code == 302
    assert not StandingChange.objects.exists()  # no reason, no change
    client.post(f"/staff/providers/{owner.pk}/standing/", {"standing": "delisted", "reason": "chargebacks"})
    assert ProviderReputation.objects.get(provider=owner).standing == Standing.DELISTED
    assert "Delisted" in client.get("/staff/").content.decode()
    client.force_login(owner)
    assert client.post(f"/staff/providers/{owner.pk}/standing/", {"standing": "listed", "reason": "me"}).status_code == 302
    assert ProviderReputation.objects.get(provider=owner).standing == Standing.DELISTED  # non-staff: refused
