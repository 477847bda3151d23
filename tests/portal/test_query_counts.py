"""/nodes/ and /offers/ run a constant number of queries however many nodes there are, paginated."""

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from rentals.services import start_rental
from tests.factories import UserFactory
from tests.portal.conftest import bulk_nodes

pytestmark = pytest.mark.django_db

# /nodes/: session, user, COUNT, the page of nodes, their live workers.
# /offers/: session, user, the GPU filter's choices, the page's ids with the total, its rows.
MAX_QUERIES = 5


def queries(client, url: str) -> tuple[int, str]:
    with CaptureQueriesContext(connection) as captured:
        response = client.get(url)
    assert response.status_code == 200
    return len(captured), response.content.decode()


def test_my_nodes_with_1000_nodes_is_paginated_in_constant_queries(owner, renter, model, owner_web, django_assert_max_num_queries):
    nodes = bulk_nodes(owner, 3, model=model, workers_every=1)
    few, _ = queries(owner_web, "/nodes/")

    nodes += bulk_nodes(owner, 997, model=model)
    start_rental(renter=renter, node_id=nodes[1].pk)
    with django_assert_max_num_queries(MAX_QUERIES):
        response = owner_web.get("/nodes/")
    many, body = queries(owner_web, "/nodes/")
    assert many == few
    assert body.count('class="node-row"') == 50
    assert "Page 1 of 20 · 1000 in all" in body
    last, last_body = queries(owner_web, "/nodes/?page=20")
    assert last == few and last_body.count('class="node-row"') == 50
    assert response.status_code == 200


def test_offers_with_1000_nodes_is_paginated_in_constant_queries(owner, renter_web, django_assert_max_num_queries):
    bulk_nodes(owner, 3)
    few, _ = queries(renter_web, "/offers/")

    bulk_nodes(owner, 500, gpu_model="H100", is_spot=True)
    bulk_nodes(UserFactory(), 497, gpu_model="L4")
    with django_assert_max_num_queries(MAX_QUERIES):
        renter_web.get("/offers/")
    many, body = queries(renter_web, "/offers/")
    assert many == few
    assert body.count('<tr id="offer-') == 50 and "1000 in all" in body
    filtered, filtered_body = queries(renter_web, "/offers/?gpu=H100&kind=spot&max_price=5&page=3")
    assert filtered == few and filtered_body.count('<tr id="offer-') == 50 and "500 in all" in filtered_body
    past_the_end, past_body = queries(renter_web, "/offers/?page=99")  # the last page, as Paginator.get_page
    assert "Page 20 of 20" in past_body and past_body.count('<tr id="offer-') == 50 and past_the_end == few + 2
