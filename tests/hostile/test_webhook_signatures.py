"""Issue #8, R14: what tests/preemption/test_webhooks.py leaves out. Every cloud's
webhook refuses an unsigned or wrongly signed body and a replay outside the
signed time window (old or future, or with the timestamp stripped), and leaves
no row."""

import json
import time
from datetime import timedelta

import pytest
import time_machine

from nodes.models import Reclaim
from preemption.models import NoticeCount, PreemptionNotice, ShadowReclaim
from preemption.signing import sign
from tests.preemption import docs
from tests.preemption.conftest import _at_t0, prod, webhook  # noqa: F401  (the clock stands at T0; prod mode; a client)
from tests.preemption.docs import T0

pytestmark = pytest.mark.django_db

SOURCES = ["aws", "azure", "gcp", "generic"]


def document(source: str) -> dict:
    docs.cloud_node(cloud="aws" if source in ("aws", "generic") else source, instance_id="i-0sig")
    return {
        "aws": lambda: docs.aws_warning(instance_id="i-0sig"),
        "azure": lambda: docs.azure_doc(resources=["i-0sig"], not_before=T0 + timedelta(seconds=60)),
        "gcp": lambda: docs.gcp_push(instance_id="i-0sig"),
        "generic": lambda: docs.generic(instance_id="i-0sig"),
    }[source]()


def post(webhook, source: str, body: bytes, **headers):
    return webhook.post(f"/api/v1/preemption/{source}", data=body, content_type="application/json", **headers)


def no_trace() -> bool:
    return not (
        PreemptionNotice.objects.exists() or Reclaim.objects.exists() or ShadowReclaim.objects.exists()
        or NoticeCount.objects.exists()
    )


@pytest.mark.parametrize("source", SOURCES)
def test_unsigned_and_wrongly_signed_are_401_for_every_cloud(webhook, prod, source):
    body = json.dumps(document(source)).encode()
    for headers in (
        {},
        {"HTTP_X_SIGNATURE": sign(body, secret="another-secret")},
        {"HTTP_X_SIGNATURE": sign(body + b" ")},  # another body
        {"HTTP_X_SIGNATURE": sign(body).upper()},  # not the format
        {"HTTP_AUTHORIZATION": "Token abc"},  # a user's credentials are not a signature
    ):
        response = post(webhook, source, body, **headers)
        assert response.status_code == 401, headers
        assert response.json()["code"] == "bad_signature"
    assert no_trace()


@pytest.mark.parametrize("source", SOURCES)
@pytest.mark.parametrize("skew", [-301, 301], ids=["captured-5min-ago", "dated-in-the-future"])
def test_a_signed_request_outside_the_time_window_is_refused_and_leaves_no_row(webhook, prod, source, skew):
    body = json.dumps(document(source)).encode()
    ts = str(int(time.time()) + skew)  # the clock stands at T0 (tests/preemption/conftest.py)
    response = post(webhook, source, body, HTTP_X_SIGNATURE=sign(body, timestamp=ts), HTTP_X_SIGNATURE_TIMESTAMP=ts)
    assert response.status_code == 401 and response.json()["code"] == "stale_signature"
    assert no_trace()


def test_the_window_edge_is_accepted(webhook, prod):
    body = json.dumps(document("generic")).encode()
    ts = str(int(time.time()) - 299)
    assert post(webhook, "generic", body, HTTP_X_SIGNATURE=sign(body, timestamp=ts), HTTP_X_SIGNATURE_TIMESTAMP=ts).status_code == 202


def test_stripping_the_timestamp_from_a_captured_request_does_not_bypass_the_window(webhook, prod):
    body = json.dumps(document("aws")).encode()
    ts = str(int(time.time()) - 3600)
    response = post(webhook, "aws", body, HTTP_X_SIGNATURE=sign(body, timestamp=ts))  # header dropped, MAC kept
    assert response.status_code == 401
    assert no_trace()


@pytest.mark.parametrize("ts", ["soon", "", "nan", "inf", "-inf", "1e400"])
def test_a_malformed_timestamp_is_refused(webhook, prod, ts):
    body = json.dumps(document("generic")).encode()
    response = post(webhook, "generic", body, HTTP_X_SIGNATURE=sign(body, timestamp=ts), HTTP_X_SIGNATURE_TIMESTAMP=ts)
    assert response.status_code == 401
    assert no_trace()


def test_a_replay_later_without_a_timestamp_is_the_same_row(webhook, prod):
    """Without the timestamp header a replay is accepted, and harmless: the same notice is the same row."""
    body = json.dumps(document("aws")).encode()
    first = post(webhook, "aws", body, HTTP_X_SIGNATURE=sign(body))
    with time_machine.travel(T0 + timedelta(hours=1), tick=False):
        again = post(webhook, "aws", body, HTTP_X_SIGNATURE=sign(body))
    assert first.status_code == again.status_code == 202
    assert again.json()["duplicate"] is True
    assert PreemptionNotice.objects.count() == 1 and Reclaim.objects.count() == 1
