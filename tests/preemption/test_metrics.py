"""R15: notices counted by source, kind, mode and action, for /metrics."""

import pytest

from preemption import metrics
from tests.preemption import docs
from tests.preemption.docs import signed_post

pytestmark = pytest.mark.django_db


def test_r15_notices_are_counted_by_source_kind_mode_and_action(webhook, prod, settings, model):
    docs.cloud_node(instance_id="i-0m1")
    doc = docs.aws_warning(instance_id="i-0m1")
    signed_post(webhook, "aws", doc)
    signed_post(webhook, "aws", doc)  # a redelivery is a receipt too
    signed_post(webhook, "aws", docs.aws_warning(instance_id="i-0unknown"))
    signed_post(webhook, "gcp", raw=b"{}")  # unreadable: 400, counted as invalid
    settings.PREEMPTION_MODE = "off"
    signed_post(webhook, "azure", {"whatever": True})
    got = {tuple(labels.values()): value for _, labels, value in metrics.samples()}
    assert got == {
        ("aws", "terminate", "prod", "reclaimed"): 2,
        ("aws", "terminate", "prod", "no_node"): 1,
        ("gcp", "", "prod", "invalid"): 1,
        ("azure", "", "off", "ignored"): 1,
    }
    text = metrics.render()
    assert '# TYPE preemption_notices_total counter' in text
    assert 'preemption_notices_total{source="aws",kind="terminate",mode="prod",action="reclaimed"} 2' in text
