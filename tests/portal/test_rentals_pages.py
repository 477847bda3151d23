"""Offers, renting, My rentals with the reclaim banner and notice URL, ending a rental."""

from datetime import UTC, datetime
from html import unescape

import pytest
import time_machine

from nodes.services import pause_node, resume_node
from rentals.models import Rental, RentalStatus
from rentals.services import end_rental, start_rental
from tests.factories import make_node
from tests.portal.conftest import HTMX

pytestmark = pytest.mark.django_db

T0 = datetime(2026, 11, 30, 12, 0, 0, tzinfo=UTC)


def html(response) -> str:
    return unescape(response.content.decode())


def test_offers_list_rentable_nodes_and_say_what_spot_means(owner, renter_web, owner_web):
    spot, _ = make_node(provider=owner, name="cheap-spot", is_spot=True, price_per_hour="0.80")
    on_demand, _ = make_node(provider=owner, name="steady", is_spot=False, price_per_hour="2.00")
    paused, _ = make_node(provider=owner, name="paused-one", is_spot=True)
    pause_node(node_id=paused.pk)
    make_node(provider=owner, name="gone", online=False)

    body = html(renter_web.get("/offers/"))
    assert "cheap-spot" in body and "steady" in body
    assert "paused-one" not in body and "gone" not in body
    assert "May be reclaimed with two minutes' notice" in body
    assert "two minutes' notice" in body.split("<h1>Offers</h1>")[1].split("</p>")[0]
    assert body.index("cheap-spot") < body.index("steady")  # cheapest first
    # A provider never sees their own nodes among the offers.
    assert "cheap-spot" not in html(owner_web.get("/offers/"))


def test_offers_filter_by_gpu_kind_and_price(owner, renter_web):
    make_node(provider=owner, name="h100-spot", gpu_model="H100", is_spot=True, price_per_hour="3.00")
    make_node(provider=owner, name="a100-spot", gpu_model="A100", is_spot=True, price_per_hour="1.00")
    make_node(provider=owner, name="a100-od", gpu_model="A100", is_spot=False, price_per_hour="1.50")

    def names(query: str) -> set[str]:
        body = html(renter_web.get(f"/offers/?{query}"))
        return {n for n in ("h100-spot", "a100-spot", "a100-od") if f"<strong>{n}</strong>" in body}

    assert names("") == {"h100-spot", "a100-spot", "a100-od"}
    assert names("gpu=A100") == {"a100-spot", "a100-od"}
    assert names("kind=spot") == {"h100-spot", "a100-spot"}
    assert names("kind=on_demand") == {"a100-od"}
    assert names("max_price=1.50") == {"a100-spot", "a100-od"}
    assert names("gpu=A100&kind=spot&max_price=2") == {"a100-spot"}
    assert '<option value="H100">H100</option>' in html(renter_web.get("/offers/"))
    bad = html(renter_web.get("/offers/?max_price=cheap"))
    assert "Enter a number." in bad  # shown on the form; the list is unfiltered


def test_offers_filter_with_htmx_returns_only_the_list(owner, renter_web):
    make_node(provider=owner, name="a100-spot", is_spot=True)
    response = renter_web.get("/offers/?kind=spot", HTTP_HX_REQUEST="true", HTTP_HX_TARGET="offer-list")
    assert response.status_code == 200
    body = html(response)
    assert body.lstrip().startswith('<div id="offer-list">') and "a100-spot" in body and "<html" not in body


def test_rent_starts_a_rental_and_shows_it(owner, renter, renter_web):
    node, _ = make_node(provider=owner, name="rig", is_spot=True)
    response = renter_web.post(f"/offers/{node.pk}/rent/", {"hours": "2"})
    rental = Rental.objects.get(renter=renter)
    assert response.status_code == 302 and response["Location"] == f"/rentals/{rental.pk}/"
    assert rental.is_spot and rental.term_ends_at is not None
    page = html(renter_web.get(response["Location"]))
    assert "You rented rig." in page and "No reclaim is scheduled." in page
    open_ended = renter_web.post(f"/offers/{make_node(provider=owner)[0].pk}/rent/", {"hours": ""})
    assert open_ended.status_code == 302
    assert Rental.objects.filter(renter=renter, term_ends_at__isnull=True).count() == 1


def test_rent_refused_is_a_409_message(owner, renter_web, owner_web):
    paused, _ = make_node(provider=owner, name="paused", is_spot=True)
    pause_node(node_id=paused.pk)
    response = renter_web.post(f"/offers/{paused.pk}/rent/")
    assert response.status_code == 409 and "The node is paused by its owner." in html(response)
    own = owner_web.post(f"/offers/{paused.pk}/rent/")
    assert own.status_code == 409 and "You cannot rent your own node." in html(own)
    assert renter_web.post("/offers/999999/rent/").status_code == 409
    assert renter_web.post(f"/offers/{paused.pk}/rent/", {"hours": "-3"}).status_code == 400
    assert not Rental.objects.exists()


def test_rentals_page_shows_notice_url_and_a_drain_handler(owner, renter, renter_web):
    node, _ = make_node(provider=owner, is_spot=True)
    rental = start_rental(renter=renter, node_id=node.pk)
    body = html(renter_web.get("/rentals/"))
    url = f"http://testserver/meta/{rental.notice_token}/latest/meta-data/spot/instance-action"
    assert f'<code id="notice-url-{rental.pk}">{url}</code>' in body
    assert f'NOTICE_URL="{url}"' in body and 'curl -fsS "$NOTICE_URL"' in body
    assert 'hx-trigger="every 2s"' in body  # an open rental watches for a reclaim
    assert "Reclaim at" not in body


def test_reclaim_banner_with_time_and_countdown_once_reclaim_at_is_set(owner, renter, renter_web, owner_web):
    node, _ = make_node(provider=owner, is_spot=True)
    rental = start_rental(renter=renter, node_id=node.pk)
    status = html(renter_web.get(f"/rentals/{rental.pk}/", **HTMX))
    seen = status.split("?seen=")[1].split('"')[0]
    assert renter_web.get(f"/rentals/{rental.pk}/?seen={seen}", **HTMX).status_code == 204

    with time_machine.travel(T0, tick=False):
        owner_web.post(f"/nodes/{node.pk}/pause/")
        polled = renter_web.get(f"/rentals/{rental.pk}/?seen={seen}", **HTMX)
        page = html(renter_web.get("/rentals/"))
    assert polled.status_code == 200
    body = html(polled)
    assert "Reclaim at 12:02:00 UTC." in body
    assert '<time class="countdown" datetime="2026-11-30T12:02:00+00:00" data-countdown>2:00</time>' in body
    assert "Reclaim at 12:02:00 UTC." in page

    resume_node(node_id=node.pk)  # Available cancels the reclaim: the banner goes
    assert "No reclaim is scheduled." in html(renter_web.get(f"/rentals/{rental.pk}/", **HTMX))


def test_ended_rentals_show_their_end_reason(owner, renter, renter_web):
    node, _ = make_node(provider=owner, is_spot=True)
    rental = start_rental(renter=renter, node_id=node.pk)
    with time_machine.travel(T0, tick=False):
        pause_node(node_id=node.pk)
    from rentals.services import carry_out_due_rentals

    with time_machine.travel("2026-11-30 12:02:00Z", tick=False):
        carry_out_due_rentals()
    body = html(renter_web.get("/rentals/"))
    assert "Spot reclaim: the owner took the node back" in body and f"#{rental.pk}" in body
    status = html(renter_web.get(f"/rentals/{rental.pk}/", **HTMX))
    assert "every 2s" not in status and "Ended" in status  # an ended rental stops polling


def test_renter_ends_a_rental(owner, renter, renter_web):
    node, _ = make_node(provider=owner)
    rental = start_rental(renter=renter, node_id=node.pk)
    response = renter_web.post(f"/rentals/{rental.pk}/end/")
    assert response.status_code == 302 and response["Location"] == "/rentals/"
    rental.refresh_from_db()
    assert rental.status == RentalStatus.ENDED and rental.end_reason == "renter"
    assert "Ended by you" in html(renter_web.get("/rentals/"))
    again = renter_web.post(f"/rentals/{rental.pk}/end/")
    assert again.status_code == 409 and "This rental has already ended." in html(again)


@pytest.mark.parametrize("who", ["owner_web", "outsider_web"])
def test_r14_only_the_renter_sees_and_ends_a_rental(who, owner, renter, request):
    node, _ = make_node(provider=owner)
    rental = start_rental(renter=renter, node_id=node.pk)
    web = request.getfixturevalue(who)
    assert web.get(f"/rentals/{rental.pk}/").status_code == 404
    assert web.post(f"/rentals/{rental.pk}/end/").status_code == 404
    assert rental.notice_token not in html(web.get("/rentals/"))
    rental.refresh_from_db()
    assert rental.status == RentalStatus.ACTIVE
    end_rental(rental_id=rental.pk, reason="renter")
