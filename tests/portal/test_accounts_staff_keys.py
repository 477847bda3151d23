"""Sign up, log in, log out; the staff page; API keys; every page answers the anonymous with a log-in."""

import pytest
from django.contrib.auth import get_user_model

from inference.keys import hash_key
from inference.models import ApiKey
from rentals.services import end_rental, start_rental
from tests.factories import make_node

pytestmark = pytest.mark.django_db


def html(response) -> str:
    return response.content.decode()


def test_home_invites_the_anonymous_and_sends_users_to_their_nodes(client, owner_web):
    body = html(client.get("/"))
    assert 'href="/accounts/signup/"' in body and 'href="/accounts/login/"' in body
    assert owner_web.get("/")["Location"] == "/nodes/"


@pytest.mark.parametrize("url", ["/nodes/", "/nodes/new/", "/nodes/1/", "/offers/", "/rentals/", "/rentals/1/", "/keys/", "/staff/"])
def test_every_page_asks_the_anonymous_to_log_in(client, url):
    response = client.get(url)
    assert response.status_code == 302 and response["Location"] == f"/accounts/login/?next={url}"


def test_sign_up_logs_in_one_account_for_both_sides(client):
    response = client.post(
        "/accounts/signup/", {"username": "newbie", "password1": "a-long-Passphrase-7", "password2": "a-long-Passphrase-7"}
    )
    assert response.status_code == 302 and response["Location"] == "/nodes/"
    assert get_user_model().objects.filter(username="newbie").exists()
    assert client.get("/nodes/").status_code == 200 and client.get("/offers/").status_code == 200


def test_sign_up_with_bad_input_is_400(client):
    response = client.post("/accounts/signup/", {"username": "x", "password1": "short", "password2": "other"})
    assert response.status_code == 400
    assert not get_user_model().objects.filter(username="x").exists()


def test_log_in_and_log_out(client, owner):
    assert client.get("/accounts/login/").status_code == 200
    bad = client.post("/accounts/login/", {"username": "owner", "password": "nope"})
    assert bad.status_code == 200 and "Please enter a correct username and password" in html(bad)
    good = client.post("/accounts/login/", {"username": "owner", "password": "pw-correct-horse"})
    assert good.status_code == 302 and good["Location"] == "/nodes/"
    assert ">Log out</button>" in html(client.get("/nodes/"))
    assert client.post("/accounts/logout/").status_code == 302
    assert client.get("/nodes/").status_code == 302


def test_staff_page_is_for_staff_only(owner_web, outsider_web, staff_web):
    assert owner_web.get("/staff/").status_code == 403
    assert outsider_web.get("/staff/").status_code == 403
    assert staff_web.get("/staff/").status_code == 200
    assert ">Staff</a>" in html(staff_web.get("/nodes/")) and ">Staff</a>" not in html(owner_web.get("/nodes/"))
    assert staff_web.get("/admin/").status_code == 200


def test_staff_page_lists_providers_with_their_rental_counts(owner, renter, outsider, staff_web):
    spot, _ = make_node(provider=owner, name="spot-1", is_spot=True)
    steady, _ = make_node(provider=owner, name="steady-1")
    make_node(provider=outsider, name="lonely")
    end_rental(rental_id=start_rental(renter=renter, node_id=spot.pk).pk, reason="provider")
    end_rental(rental_id=start_rental(renter=renter, node_id=steady.pk).pk, reason="provider")
    start_rental(renter=renter, node_id=steady.pk)

    providers = staff_web.get("/staff/").context["providers"].object_list
    counts = {p.username: (p.node_count, p.rental_count, p.open_rental_count, p.spot_rental_count, p.ended_by_provider) for p in providers}
    # Spot rentals ended by their provider do not count against them (R11).
    assert counts == {"owner": (2, 3, 1, 1, 1), "outsider": (1, 0, 0, 0, 0)}
    nodes = {n.name: (n.rental_count, n.ended_by_provider) for n in staff_web.get("/staff/").context["nodes"].object_list}
    assert nodes == {"steady-1": (2, 1), "spot-1": (1, 0), "lonely": (0, 0)}
    assert "renter" not in counts  # renters are not providers


def test_api_keys_are_shown_once_and_revocable(owner, owner_web, outsider_web):
    created = owner_web.post("/keys/", {"name": "laptop"})
    assert created.status_code == 201
    raw = html(created).split('<code id="new-key">')[1].split("</code>")[0]
    key = ApiKey.objects.get(user=owner)
    assert key.key_hash == hash_key(raw) and key.name == "laptop"
    assert raw not in html(owner_web.get("/keys/"))
    assert outsider_web.post(f"/keys/{key.pk}/revoke/").status_code == 404
    assert owner_web.post(f"/keys/{key.pk}/revoke/").status_code == 302
    key.refresh_from_db()
    assert key.revoked_at is not None
