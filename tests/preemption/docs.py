"""Cloud documents for tests: the fixtures (real shapes), varied per test, and signed posts."""

import base64
import copy
import json
import uuid
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime
from pathlib import Path
from typing import Any

from django.conf import settings

from preemption.signing import sign
from tests.factories import make_node

FIXTURES = Path(__file__).parent / "fixtures"
T0 = datetime(2026, 12, 1, 8, 15, 0, tzinfo=UTC)


def load(name: str) -> Any:
    return json.loads((FIXTURES / name).read_text())


def iso(at: datetime) -> str:
    return at.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def aws_warning(*, instance_id: str, at: datetime = T0, event_id: str | None = None, action: str = "terminate") -> dict:
    doc = load("aws-eventbridge-spot-interruption.json")
    doc["id"] = event_id or str(uuid.uuid4())
    doc["time"] = iso(at)
    doc["detail"]["instance-id"] = instance_id
    doc["detail"]["instance-action"] = action
    doc["resources"] = [f"arn:aws:ec2:eu-west-1b:instance/{instance_id}"]
    return doc


def aws_rebalance(*, instance_id: str, at: datetime = T0, event_id: str | None = None) -> dict:
    doc = load("aws-eventbridge-rebalance.json")
    doc["id"] = event_id or str(uuid.uuid4())
    doc["time"] = iso(at)
    doc["detail"]["instance-id"] = instance_id
    return doc


def imds_action(*, at: datetime, action: str = "terminate") -> dict:
    doc = load("aws-imds-instance-action.json")
    doc.update(action=action, time=iso(at))
    return doc


def azure_doc(
    *, resources: list[str], not_before: datetime, incarnation: int = 7, event_id: str | None = None,
    event_type: str = "Preempt",
) -> dict:
    doc = load("azure-scheduled-events.json")
    doc["DocumentIncarnation"] = incarnation
    event = doc["Events"][0]
    event.update(
        EventId=event_id or str(uuid.uuid4()).upper(),
        EventType=event_type,
        Resources=resources,
        NotBefore=format_datetime(not_before.astimezone(UTC), usegmt=True),
    )
    return doc


def gcp_entry(*, instance_id: str = "", name: str = "spot-l4-9", at: datetime = T0, operation_id: str | None = None) -> dict:
    entry = load("gcp-preempted-logentry.json")
    entry["operation"]["id"] = operation_id or f"systemevent-{uuid.uuid4().hex}"
    entry["insertId"] = uuid.uuid4().hex[:13]
    entry["timestamp"] = at.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"
    entry["protoPayload"]["resourceName"] = f"projects/render-farm-42/zones/europe-west4-a/instances/{name}"
    entry["resource"]["labels"]["instance_id"] = instance_id or str(uuid.uuid4().int)[:19]
    return entry


def gcp_push(entry: dict | None = None, **kwargs: Any) -> dict:
    envelope = load("gcp-pubsub-preempted.json")
    entry = entry if entry is not None else gcp_entry(**kwargs)
    envelope["message"]["data"] = base64.b64encode(json.dumps(entry).encode()).decode()
    envelope["message"]["messageId"] = str(uuid.uuid4().int)[:17]
    return envelope


def generic(*, event_id: str | None = None, action: str = "terminate", not_before: datetime | None = None, **target: Any) -> dict:
    doc = {"event_id": event_id or uuid.uuid4().hex, "action": action, **target}
    if not_before is not None:
        doc["not_before"] = iso(not_before)
    return doc


def signed_post(client: Any, source: str, doc: Any = None, *, raw: bytes | None = None, timestamp: str | None = None,
                secret: str | None = None, signature: str | None = None) -> Any:
    """POST a document to a webhook, signed as the cloud's relay would sign it."""
    body = raw if raw is not None else json.dumps(doc).encode()
    headers = {"HTTP_X_SIGNATURE": signature if signature is not None else sign(body, secret=secret, timestamp=timestamp)}
    if timestamp is not None:
        headers["HTTP_X_SIGNATURE_TIMESTAMP"] = timestamp
    return client.post(f"/api/v1/preemption/{source}", data=body, content_type="application/json", **headers)


def cloud_node(*, cloud: str = "aws", instance_id: str | None = None, is_spot: bool = True, zone: str = "eu-west-1b",
               instance_type: str = "g5.xlarge", **fields: Any):
    """A spot node on a cloud, known by its instance id."""
    return make_node(
        is_spot=is_spot, cloud=cloud, instance_type=instance_type, zone=zone,
        cloud_instance_id=instance_id or f"i-{uuid.uuid4().hex[:17]}", **fields,
    )


def deadline_for(not_before: datetime, now: datetime) -> datetime:
    return max(min(now + timedelta(seconds=settings.DRAIN_CEILING_S), not_before - timedelta(seconds=settings.NOTICE_MARGIN_S)), now)


def copy_doc(doc: Any) -> Any:
    return copy.deepcopy(doc)
