"""Issue #8: the dashboard's state-changing POSTs need the CSRF token (Pause, the spot
toggle), and so does the API when called with the session cookie."""

import pytest
from django.test import Client

from nodes.models import Node, Reclaim
from tests.factories import make_node

pytestmark = pytest.mark.django_db


@pytest.fixture
def browser(owner):
    client = Client(enforce_csrf_checks=True)
    client.force_login(owner)
    return client


def csrf_token(client, node) -> str:
    assert client.get(f"/nodes/{node.pk}/pause/").status_code == 200  # the confirm page carries the token
    return client.cookies["csrftoken"].value


def test_pause_without_the_token_is_403_and_changes_nothing(browser, owner):
    node, _ = make_node(provider=owner, is_spot=True)
    response = browser.post(f"/nodes/{node.pk}/pause/")
    assert response.status_code == 403
    node.refresh_from_db()
    assert node.workload_enabled is True and not Reclaim.objects.exists()


def test_pause_with_a_wrong_token_is_403(browser, owner):
    node, _ = make_node(provider=owner, is_spot=True)
    csrf_token(browser, node)
    response = browser.post(f"/nodes/{node.pk}/pause/", {"csrfmiddlewaretoken": "x" * 64})
    assert response.status_code == 403
    assert Node.objects.get(pk=node.pk).workload_enabled is True


def test_pause_with_the_token_pauses(browser, owner):
    node, _ = make_node(provider=owner, is_spot=True)
    token = csrf_token(browser, node)
    response = browser.post(f"/nodes/{node.pk}/pause/", {"csrfmiddlewaretoken": token})
    assert response.status_code == 302
    assert Node.objects.get(pk=node.pk).workload_enabled is False


def test_spot_toggle_without_the_token_is_403_and_changes_nothing(browser, owner):
    node, _ = make_node(provider=owner, is_spot=True)
    response = browser.post(f"/nodes/{node.pk}/spot/", {"is_spot": "false"})
    assert response.status_code == 403
    assert Node.objects.get(pk=node.pk).is_spot is True


def test_spot_toggle_with_the_token_in_the_htmx_header_works(browser, owner):
    node, _ = make_node(provider=owner, is_spot=True)
    token = csrf_token(browser, node)
    response = browser.post(f"/nodes/{node.pk}/spot/", {"is_spot": "false"}, HTTP_X_CSRFTOKEN=token)
    assert response.status_code == 302
    assert Node.objects.get(pk=node.pk).is_spot is False


def test_api_with_the_session_cookie_needs_the_token_too(browser, owner):
    node, _ = make_node(provider=owner, is_spot=True)
    response = browser.post(f"/api/v1/nodes/{node.pk}/pause", content_type="application/json")
    assert response.status_code == 403
    assert response.json()["code"] == "permission_denied" and "CSRF" in response.json()["detail"]
    assert Node.objects.get(pk=node.pk).workload_enabled is True
    token = csrf_token(browser, node)
    assert browser.post(f"/api/v1/nodes/{node.pk}/pause", content_type="application/json", HTTP_X_CSRFTOKEN=token).status_code == 202
