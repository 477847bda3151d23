"""Each cloud's shape read into one notice; anything else is refused with a reason (400)."""

import base64
import json
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given, settings as hyp_settings
from hypothesis import strategies as st

from preemption import adapters
from preemption.adapters import UnparseableNotice
from tests.preemption import docs
from tests.preemption.docs import T0

NOW = T0 + timedelta(seconds=2)


def test_aws_interruption_warning_acts_two_minutes_after_the_event_time():
    doc = docs.load("aws-eventbridge-spot-interruption.json")
    [notice] = adapters.parse_aws_event(doc, received_at=NOW)
    assert notice.source == "aws" and notice.kind == "terminate"
    assert notice.external_id == "9c2f6d1a-5e4b-4c7d-8a1f-2b3c4d5e6f70"
    assert notice.instance_ids == ("i-0f1e2d3c4b5a69788",)
    assert notice.not_before == datetime(2026, 12, 1, 8, 17, 0, tzinfo=UTC)


@pytest.mark.parametrize("action", ["stop", "hibernate"])
def test_aws_warning_stop_and_hibernate_are_their_own_kinds(action):
    [notice] = adapters.parse_aws_event(docs.aws_warning(instance_id="i-1", action=action), received_at=NOW)
    assert notice.kind == action


def test_aws_rebalance_recommendation_is_a_soft_signal_without_a_time():
    [notice] = adapters.parse_aws_event(docs.load("aws-eventbridge-rebalance.json"), received_at=NOW)
    assert notice.kind == "rebalance" and notice.not_before is None
    assert notice.instance_ids == ("i-0f1e2d3c4b5a69788",)


def test_aws_other_detail_types_are_not_notices():
    doc = docs.aws_warning(instance_id="i-1")
    doc["detail-type"] = "EC2 Instance State-change Notification"
    assert adapters.parse_aws_event(doc, received_at=NOW) == []


def test_aws_instance_metadata_action_and_rebalance():
    [action] = adapters.parse_aws_metadata(docs.load("aws-imds-instance-action.json"), received_at=NOW, node_id=5, instance_id="i-9")
    assert action.kind == "terminate" and action.node_id == 5
    assert action.not_before == datetime(2026, 12, 1, 8, 17, 0, tzinfo=UTC)
    # Every poll of the same scheduled action reads the same: one id for it.
    [again] = adapters.parse_aws_metadata(docs.load("aws-imds-instance-action.json"), received_at=NOW + timedelta(seconds=5), node_id=5, instance_id="i-9")
    assert again.external_id == action.external_id
    [rebalance] = adapters.parse_aws_metadata(docs.load("aws-imds-rebalance.json"), received_at=NOW, node_id=5)
    assert rebalance.kind == "rebalance" and rebalance.not_before is None


def test_azure_preempt_event_with_rfc1123_not_before_one_notice_per_vm():
    doc = docs.load("azure-scheduled-events.json")
    doc["Events"][0]["Resources"] = ["spot-h100-vm-12", "spot-h100-vm-13"]
    doc["Events"].append({"EventId": "F00", "EventType": "Freeze", "Resources": ["other"], "NotBefore": ""})
    notices = adapters.parse_azure(doc, received_at=NOW)
    assert [n.instance_ids for n in notices] == [("spot-h100-vm-12",), ("spot-h100-vm-13",)]
    assert all(n.not_before == datetime(2026, 12, 1, 8, 15, 30, tzinfo=UTC) for n in notices)
    assert all(n.incarnation == 7 and n.kind == "terminate" for n in notices)
    assert notices[0].external_id == "5A1B2C3D-4E5F-4061-8273-94A5B6C7D8E9/spot-h100-vm-12@7"


def test_azure_started_event_with_empty_not_before_is_happening_now():
    doc = docs.azure_doc(resources=["vm-1"], not_before=T0)
    doc["Events"][0]["NotBefore"] = ""
    [notice] = adapters.parse_azure(doc, received_at=NOW)
    assert notice.not_before == NOW


def test_azure_agent_document_is_limited_to_its_own_vm():
    doc = docs.azure_doc(resources=["vm-1", "vm-2"], not_before=T0)
    [notice] = adapters.parse_agent("azure", doc, received_at=NOW, node_id=3, instance_id="vm-2")
    assert notice.node_id == 3 and notice.instance_ids == ("vm-2",)


def test_azure_document_without_preempt_is_no_notice():
    assert adapters.parse_azure({"DocumentIncarnation": 2, "Events": []}, received_at=NOW) == []


def test_gcp_pubsub_push_of_a_preempted_audit_entry():
    [notice] = adapters.parse_gcp_push(docs.load("gcp-pubsub-preempted.json"), received_at=NOW)
    assert notice.source == "gcp" and notice.kind == "terminate"
    assert notice.instance_ids == ("7193846502718364159", "spot-l4-9")
    assert notice.external_id == "systemevent-1796112900000-6a3c2d4e5f607-8b9c0d1e-2f3a4b5c"
    # About 30 s from the moment preemption began.
    assert notice.not_before == datetime(2026, 12, 1, 8, 15, 30, 318000, tzinfo=UTC)


def test_gcp_other_audit_methods_are_not_notices():
    entry = docs.gcp_entry()
    entry["protoPayload"]["methodName"] = "v1.compute.instances.stop"
    entry["operation"]["producer"] = "compute.googleapis.com"
    assert adapters.parse_gcp_push(docs.gcp_push(entry), received_at=NOW) == []


def test_gcp_metadata_true_is_a_30_second_notice_false_is_nothing():
    [notice] = adapters.parse_agent("gcp", "TRUE", received_at=NOW, node_id=4, instance_id="spot-l4-9")
    assert notice.not_before == NOW + timedelta(seconds=30) and notice.node_id == 4
    [same_window] = adapters.parse_agent("gcp", {"preempted": "TRUE"}, received_at=NOW + timedelta(seconds=1), node_id=4, instance_id="spot-l4-9")
    assert same_window.external_id == notice.external_id
    assert adapters.parse_agent("gcp", "FALSE", received_at=NOW, node_id=4) == []


def test_generic_by_instance_or_node_id():
    [by_instance] = adapters.parse_generic(docs.generic(instance_id="vm-7", not_before=T0), received_at=NOW)
    assert by_instance.instance_ids == ("vm-7",) and by_instance.not_before == T0
    [by_node] = adapters.parse_generic(docs.generic(node_id=12, action="stop"), received_at=NOW)
    assert by_node.node_id == 12 and by_node.not_before is None and by_node.kind == "stop"


def _b64(obj) -> str:
    return base64.b64encode(json.dumps(obj).encode()).decode()


MALFORMED = [
    ("aws", []),
    ("aws", {"id": "x", "detail": {"instance-id": "i-1"}}),  # no detail-type
    ("aws", {"detail-type": adapters.AWS_WARNING, "id": "x", "detail": {"instance-action": "terminate"}}),
    ("aws", {"detail-type": adapters.AWS_WARNING, "id": "x", "detail": {"instance-id": "i-1", "instance-action": "explode"}}),
    ("aws", {"detail-type": adapters.AWS_WARNING, "id": "x", "time": "soon", "detail": {"instance-id": "i-1", "instance-action": "stop"}}),
    ("aws", {"detail-type": adapters.AWS_WARNING, "detail": {"instance-id": "i-1", "instance-action": "stop"}}),  # no id
    ("azure", {"Events": []}),
    ("azure", {"DocumentIncarnation": "three", "Events": []}),
    ("azure", {"DocumentIncarnation": 3, "Events": [{"EventType": "Preempt", "Resources": ["vm"], "NotBefore": ""}]}),
    ("azure", {"DocumentIncarnation": 3, "Events": [{"EventId": "e", "EventType": "Preempt", "Resources": [], "NotBefore": ""}]}),
    ("azure", {"DocumentIncarnation": 3, "Events": [{"EventId": "e", "EventType": "Preempt", "Resources": ["vm"], "NotBefore": "tomorrow"}]}),
    ("gcp", {"message": {}}),
    ("gcp", {"message": {"data": "%%% not base64 %%%"}}),
    ("gcp", {"message": {"data": _b64(["a list"])}}),
    ("gcp", {"message": {"data": _b64({"protoPayload": {"methodName": adapters.GCP_PREEMPTED}})}}),  # no instance
    ("generic", {"event_id": "e", "action": "terminate"}),  # no target
    ("generic", {"event_id": "e", "action": "melt", "instance_id": "i"}),
    ("generic", {"action": "terminate", "instance_id": "i"}),
    ("generic", {"event_id": "e", "action": "terminate", "instance_id": "i", "not_before": "later"}),
]


@pytest.mark.parametrize(("source", "doc"), MALFORMED)
def test_malformed_documents_are_refused_with_a_reason(source, doc):
    with pytest.raises(UnparseableNotice) as refused:
        adapters.parse_webhook(source, doc, received_at=NOW)
    assert refused.value.status_code == 400 and refused.value.detail


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=12), children, max_size=5),
    max_leaves=20,
)


@hyp_settings(max_examples=150, deadline=None)
@given(source=st.sampled_from(["aws", "azure", "gcp", "generic"]), doc=json_values)
def test_any_json_is_read_or_refused_never_crashes(source, doc):
    try:
        notices = adapters.parse_webhook(source, doc, received_at=NOW)
    except UnparseableNotice:
        return
    assert all(n.external_id and n.kind in ("terminate", "stop", "hibernate", "rebalance") for n in notices)
