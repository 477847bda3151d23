"""Each cloud's own notice shape turned into one `ParsedNotice`.

Pure functions: a document (already JSON-decoded) and the time it arrived in,
a list of notices out. A well-formed document that announces nothing we act
on (another EventBridge detail-type, a Scheduled Events document with only a
Freeze, another audit-log method) gives an empty list: answering it with an
error would only make the sender retry it. A document we cannot read raises
`UnparseableNotice` (400).

Lead times when the document carries no time of its own: AWS acts two minutes
after its warning, GCP about 30 s after a preemption begins.
"""

import base64
import binascii
import json
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from email.utils import parsedate_to_datetime
from typing import Any

from django.utils.dateparse import parse_datetime

from marketplace.errors import DomainError
from preemption.models import Kind, Source

AWS_WARNING = "EC2 Spot Instance Interruption Warning"
AWS_REBALANCE = "EC2 Instance Rebalance Recommendation"
AWS_LEAD = timedelta(seconds=120)
GCP_PREEMPTED = "compute.instances.preempted"
GCP_LEAD = timedelta(seconds=30)
AZURE_LOSING_EVENTS = ("Preempt", "Terminate")
ACTIONS = {k.value: k.value for k in Kind}


class UnparseableNotice(DomainError):
    status_code = 400
    code = "unparseable_notice"
    default_detail = "The notice is not in a shape this endpoint reads."


@dataclass(frozen=True)
class ParsedNotice:
    source: str
    external_id: str
    kind: str
    instance_ids: tuple[str, ...] = ()
    node_id: int | None = None
    not_before: datetime | None = None
    incarnation: int | None = None
    document: dict[str, Any] = field(default_factory=dict)

    @property
    def instance_id(self) -> str:
        return self.instance_ids[0] if self.instance_ids else ""


# --- small readers --------------------------------------------------------------------


def _object(value: Any, what: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise UnparseableNotice(f"{what} must be a JSON object.")
    return value


def _text(container: dict[str, Any], key: str, what: str) -> str:
    value = container.get(key)
    if isinstance(value, int) and not isinstance(value, bool):
        value = str(value)
    if not isinstance(value, str) or not value.strip():
        raise UnparseableNotice(f"{what} needs a non-empty {key!r}.")
    if len(value) > 200:
        raise UnparseableNotice(f"{what}: {key!r} is too long.")
    return value.strip()


def _iso_time(value: Any, what: str) -> datetime:
    parsed = None
    if isinstance(value, str):
        try:
            parsed = parse_datetime(value.strip())
        except ValueError:
            parsed = None
        if parsed is None and "." in value:
            # Nanosecond fractions (GCP's receiveTimestamp) are more than datetime holds.
            head, _, tail = value.strip().partition(".")
            digits = "".join(c for c in tail if c.isdigit())
            zone = tail[len(digits):]
            try:
                parsed = parse_datetime(f"{head}.{digits[:6]}{zone}")
            except ValueError:
                parsed = None
    if parsed is None:
        raise UnparseableNotice(f"{what} must be an ISO 8601 time, not {value!r}.")
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


def _optional_iso_time(value: Any, what: str) -> datetime | None:
    return None if value in (None, "") else _iso_time(value, what)


def _rfc1123_time(value: Any, what: str) -> datetime:
    try:
        parsed = parsedate_to_datetime(value) if isinstance(value, str) else None
    except (TypeError, ValueError, IndexError):
        parsed = None
    if parsed is None:
        raise UnparseableNotice(f"{what} must be an RFC 1123 date like 'Mon, 30 Nov 2026 10:00:30 GMT', not {value!r}.")
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


# --- AWS --------------------------------------------------------------------------------


def parse_aws_event(document: Any, *, received_at: datetime) -> list[ParsedNotice]:
    """An EventBridge event: a spot interruption warning or a rebalance recommendation."""
    event = _object(document, "An EventBridge event")
    detail_type = event.get("detail-type")
    if not isinstance(detail_type, str):
        raise UnparseableNotice("An EventBridge event needs its 'detail-type'.")
    if detail_type not in (AWS_WARNING, AWS_REBALANCE):
        return []
    event_id = _text(event, "id", "An EventBridge event")
    detail = _object(event.get("detail"), "The event's 'detail'")
    instance_id = _text(detail, "instance-id", "The event's detail")
    sent_at = _optional_iso_time(event.get("time"), "The event's 'time'") or received_at
    if detail_type == AWS_REBALANCE:
        kind, not_before = Kind.REBALANCE, None
    else:
        action = _text(detail, "instance-action", "An interruption warning's detail").lower()
        if action not in (Kind.TERMINATE, Kind.STOP, Kind.HIBERNATE):
            raise UnparseableNotice(f"Unknown instance-action {action!r}: terminate, stop or hibernate.")
        kind, not_before = action, sent_at + AWS_LEAD
    return [
        ParsedNotice(
            source=Source.AWS,
            external_id=event_id,
            kind=kind,
            instance_ids=(instance_id,),
            not_before=not_before,
            document=event,
        )
    ]


def parse_aws_metadata(document: Any, *, received_at: datetime, node_id: int, instance_id: str = "") -> list[ParsedNotice]:
    """What an agent read from IMDS: spot/instance-action {"action","time"} or the
    rebalance recommendation {"noticeTime"}; an EventBridge event is read as one."""
    doc = _object(document, "An AWS metadata document")
    if "detail-type" in doc:
        return [_on_node(n, node_id) for n in parse_aws_event(doc, received_at=received_at)]
    who = instance_id or f"node-{node_id}"
    if "action" in doc:
        action = _text(doc, "action", "spot/instance-action").lower()
        if action not in (Kind.TERMINATE, Kind.STOP, Kind.HIBERNATE):
            raise UnparseableNotice(f"Unknown action {action!r}: terminate, stop or hibernate.")
        when = _iso_time(doc.get("time"), "spot/instance-action's 'time'")
        # The same scheduled action reads the same on every poll: one id for it.
        external_id = f"imds:{who}:{action}:{when.isoformat()}"
        return [ParsedNotice(Source.AWS, external_id, action, (who,), node_id, when, None, doc)]
    if "noticeTime" in doc:
        when = _iso_time(doc.get("noticeTime"), "The rebalance recommendation's 'noticeTime'")
        external_id = f"imds-rebalance:{who}:{when.isoformat()}"
        return [ParsedNotice(Source.AWS, external_id, Kind.REBALANCE, (who,), node_id, None, None, doc)]
    raise UnparseableNotice("An AWS metadata document has 'action' and 'time', or 'noticeTime'.")


# --- Azure ------------------------------------------------------------------------------


def parse_azure(
    document: Any, *, received_at: datetime, node_id: int | None = None, resources: tuple[str, ...] | None = None
) -> list[ParsedNotice]:
    """A Scheduled Events document: one notice per Preempt (or Terminate) event and VM.

    The id carries the DocumentIncarnation, so a later incarnation of the same
    event is read anew (its NotBefore may have moved) and an older one is
    recognised as stale by the node's state. `resources` limits an agent's
    document to its own VM.
    """
    doc = _object(document, "A Scheduled Events document")
    incarnation = doc.get("DocumentIncarnation")
    if isinstance(incarnation, str) and incarnation.strip().isdigit():
        incarnation = int(incarnation)
    if not isinstance(incarnation, int) or isinstance(incarnation, bool) or incarnation < 0:
        raise UnparseableNotice("A Scheduled Events document needs an integer 'DocumentIncarnation'.")
    events = doc.get("Events")
    if not isinstance(events, list):
        raise UnparseableNotice("A Scheduled Events document needs an 'Events' list.")
    notices = []
    for event in events:
        event = _object(event, "Each scheduled event")
        if event.get("EventType") not in AZURE_LOSING_EVENTS:
            continue
        event_id = _text(event, "EventId", "A Preempt event")
        names = event.get("Resources")
        if not isinstance(names, list) or not names or not all(isinstance(n, str) and n.strip() for n in names):
            raise UnparseableNotice("A Preempt event needs 'Resources', a list of VM names.")
        raw = event.get("NotBefore", "")
        # An event already started has an empty NotBefore: it is happening now.
        not_before = _rfc1123_time(raw, "A Preempt event's 'NotBefore'") if raw else received_at
        for name in names:
            name = name.strip()
            if resources is not None and name not in resources:
                continue
            notices.append(
                ParsedNotice(
                    source=Source.AZURE,
                    external_id=f"{event_id}/{name}@{incarnation}",
                    kind=Kind.TERMINATE,
                    instance_ids=(name,),
                    node_id=node_id,
                    not_before=not_before,
                    incarnation=incarnation,
                    document={"DocumentIncarnation": incarnation, "Event": event},
                )
            )
    return notices


# --- GCP ------------------------------------------------------------------------------


def parse_gcp_push(document: Any, *, received_at: datetime) -> list[ParsedNotice]:
    """A Pub/Sub push envelope whose base64 message.data is an audit log entry."""
    envelope = _object(document, "A Pub/Sub push envelope")
    message = _object(envelope.get("message"), "The envelope's 'message'")
    data = message.get("data")
    if not isinstance(data, str) or not data:
        raise UnparseableNotice("The Pub/Sub message needs base64 'data'.")
    try:
        entry = json.loads(base64.b64decode(data, validate=True))
    except (binascii.Error, ValueError, UnicodeDecodeError):
        raise UnparseableNotice("The Pub/Sub message's 'data' is not base64 of a JSON log entry.") from None
    entry = _object(entry, "The log entry in 'data'")
    payload = entry.get("protoPayload")
    payload = payload if isinstance(payload, dict) else {}
    if payload.get("methodName") != GCP_PREEMPTED and _get(entry, "operation", "producer") != GCP_PREEMPTED:
        if not payload and "operation" not in entry:
            raise UnparseableNotice("The log entry has no protoPayload.methodName.")
        return []
    labels = _get(entry, "resource", "labels")
    labels = labels if isinstance(labels, dict) else {}
    candidates = []
    if labels.get("instance_id") not in (None, ""):
        candidates.append(str(labels["instance_id"]))
    resource_name = payload.get("resourceName")
    if isinstance(resource_name, str) and "/instances/" in resource_name:
        candidates.append(resource_name.rsplit("/instances/", 1)[1])
    if not candidates:
        raise UnparseableNotice("The log entry names no instance (resource.labels.instance_id or resourceName).")
    operation_id = _get(entry, "operation", "id")
    external_id = operation_id or entry.get("insertId") or message.get("messageId") or message.get("message_id")
    if not isinstance(external_id, str) or not external_id:
        raise UnparseableNotice("The log entry has no operation.id, insertId or messageId to know it again by.")
    began = (
        _optional_iso_time(entry.get("timestamp"), "The log entry's 'timestamp'")
        or _optional_iso_time(message.get("publishTime"), "The message's 'publishTime'")
        or received_at
    )
    return [
        ParsedNotice(
            source=Source.GCP,
            external_id=external_id[:255],
            kind=Kind.TERMINATE,
            instance_ids=tuple(candidates),
            not_before=began + GCP_LEAD,
            document=entry,
        )
    ]


def parse_gcp_metadata(document: Any, *, received_at: datetime, node_id: int, instance_id: str = "") -> list[ParsedNotice]:
    """What an agent read from instance/preempted: "TRUE" once preemption has begun.

    The VM has about 30 s from then. Readings within one 30 s window are one
    notice (one row); a later window's reading is recognised by the node's state.
    """
    value = document.get("preempted") if isinstance(document, dict) else document
    if isinstance(value, bool):
        value = "TRUE" if value else "FALSE"
    if not isinstance(value, str) or value.strip().upper() not in ("TRUE", "FALSE"):
        raise UnparseableNotice('instance/preempted reads "TRUE" or "FALSE".')
    if value.strip().upper() == "FALSE":
        return []
    who = instance_id or f"node-{node_id}"
    window = int(received_at.timestamp() // GCP_LEAD.total_seconds())
    return [
        ParsedNotice(
            source=Source.GCP,
            external_id=f"metadata:{who}:{window}",
            kind=Kind.TERMINATE,
            instance_ids=(who,),
            node_id=node_id,
            not_before=received_at + GCP_LEAD,
            document={"preempted": "TRUE"},
        )
    ]


# --- generic ---------------------------------------------------------------------------


def parse_generic(document: Any, *, received_at: datetime, node_id: int | None = None) -> list[ParsedNotice]:
    """{event_id, instance_id | node_id, action, not_before?}: any other cloud or neocloud."""
    doc = _object(document, "A generic notice")
    event_id = _text(doc, "event_id", "A generic notice")
    action = _text(doc, "action", "A generic notice").lower()
    if action not in ACTIONS:
        raise UnparseableNotice(f"Unknown action {action!r}: one of {', '.join(ACTIONS)}.")
    not_before = _optional_iso_time(doc.get("not_before"), "'not_before'")
    instance_ids: tuple[str, ...] = ()
    if node_id is None:
        raw_node = doc.get("node_id")
        if raw_node not in (None, ""):
            if isinstance(raw_node, bool) or not str(raw_node).isdigit():
                raise UnparseableNotice("'node_id' must be an integer.")
            node_id = int(raw_node)
        elif doc.get("instance_id") not in (None, ""):
            instance_ids = (_text(doc, "instance_id", "A generic notice"),)
        else:
            raise UnparseableNotice("A generic notice needs 'instance_id' or 'node_id'.")
    return [
        ParsedNotice(
            source=Source.GENERIC,
            external_id=event_id,
            kind=action,
            instance_ids=instance_ids,
            node_id=node_id,
            not_before=not_before if action != Kind.REBALANCE else None,
            document=doc,
        )
    ]


# --- dispatch ----------------------------------------------------------------------------


def parse_webhook(source: str, document: Any, *, received_at: datetime) -> list[ParsedNotice]:
    if source == Source.AWS:
        return parse_aws_event(document, received_at=received_at)
    if source == Source.AZURE:
        return parse_azure(document, received_at=received_at)
    if source == Source.GCP:
        return parse_gcp_push(document, received_at=received_at)
    if source == Source.GENERIC:
        return parse_generic(document, received_at=received_at)
    raise UnparseableNotice(f"Unknown source {source!r}.")


def parse_agent(source: str, document: Any, *, received_at: datetime, node_id: int, instance_id: str = "") -> list[ParsedNotice]:
    """A document an agent read on its own node: the node is the agent's, whatever it names (R14)."""
    if source == Source.AWS:
        return parse_aws_metadata(document, received_at=received_at, node_id=node_id, instance_id=instance_id)
    if source == Source.AZURE:
        own = (instance_id,) if instance_id else None
        return parse_azure(document, received_at=received_at, node_id=node_id, resources=own)
    if source == Source.GCP:
        if isinstance(document, dict) and "message" in document:
            return [_on_node(n, node_id) for n in parse_gcp_push(document, received_at=received_at)]
        return parse_gcp_metadata(document, received_at=received_at, node_id=node_id, instance_id=instance_id)
    if source == Source.GENERIC:
        return parse_generic(document, received_at=received_at, node_id=node_id)
    raise UnparseableNotice(f"Unknown source {source!r}.")


def _on_node(notice: ParsedNotice, node_id: int) -> ParsedNotice:
    return ParsedNotice(
        notice.source, notice.external_id, notice.kind, notice.instance_ids, node_id,
        notice.not_before, notice.incarnation, notice.document,
    )


def _get(container: Any, *keys: str) -> Any:
    for key in keys:
        if not isinstance(container, dict):
            return None
        container = container.get(key)
    return container
