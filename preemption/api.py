"""Cloud webhooks, the agent's notices, pools and the economics calculator (API.md)."""

import json
import math
from typing import Any

from django.urls import path
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import serializers, status
from rest_framework.exceptions import ValidationError
from rest_framework.permissions import AllowAny
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from marketplace.auth import AgentTokenAuthentication, IsAgent, IsUser
from marketplace.throttles import AgentRateThrottle, WebhookRateThrottle
from preemption import economics, services
from preemption.adapters import UnparseableNotice
from preemption.models import Source, Via
from preemption.selectors import PoolStats, find_pool, pool_stats
from preemption.signing import WebhookSignatureAuthentication, check_size

# --- replies ---------------------------------------------------------------------------


class NoticeItemSerializer(serializers.Serializer):
    notice_id = serializers.IntegerField()
    duplicate = serializers.BooleanField()
    mode = serializers.CharField()
    action = serializers.ChoiceField(choices=["ignored", "would_reclaim_spot", "reclaimed", "no_node"])
    kind = serializers.CharField()
    node_id = serializers.IntegerField(allow_null=True)
    instance_id = serializers.CharField()
    not_before = serializers.DateTimeField(allow_null=True)
    reclaim_id = serializers.IntegerField(allow_null=True)
    deadline = serializers.DateTimeField(allow_null=True)
    shadow_reclaim_id = serializers.IntegerField(allow_null=True)
    at_risk_until = serializers.DateTimeField(allow_null=True)


class NoticeReplySerializer(serializers.Serializer):
    notice_id = serializers.IntegerField(allow_null=True, help_text="Null when nothing was recorded (off, or nothing to act on).")
    duplicate = serializers.BooleanField()
    mode = serializers.ChoiceField(choices=["off", "shadow", "prod"])
    action = serializers.ChoiceField(choices=["ignored", "would_reclaim_spot", "reclaimed", "no_node"])
    notices = NoticeItemSerializer(many=True, help_text="One per notice the document held (an Azure document may hold several).")


def _item(outcome: services.Outcome) -> dict[str, Any]:
    notice = outcome.notice
    deadline = None
    if notice.reclaim_id:
        deadline = notice.reclaim.deadline
    elif notice.shadow_reclaim_id:
        deadline = notice.shadow_reclaim.deadline
    return {
        "notice_id": notice.pk,
        "duplicate": outcome.duplicate,
        "mode": notice.mode,
        "action": notice.action,
        "kind": notice.kind,
        "node_id": notice.node_id,
        "instance_id": notice.instance_id,
        "not_before": notice.not_before,
        "reclaim_id": notice.reclaim_id,
        "deadline": deadline,
        "shadow_reclaim_id": notice.shadow_reclaim_id,
        "at_risk_until": notice.at_risk_until,
    }


def reply(receipt: services.Receipt) -> Response:
    items = [_item(o) for o in receipt.outcomes]
    head = items[0] if items else None
    body = {
        "notice_id": head["notice_id"] if head else None,
        # Nothing new happened only if no notice of the document brought anything new.
        "duplicate": bool(items) and all(i["duplicate"] for i in items),
        "mode": head["mode"] if head else receipt.mode,
        "action": head["action"] if head else "ignored",
        "notices": items,
    }
    return Response(NoticeReplySerializer(body).data, status=status.HTTP_202_ACCEPTED)


def _json_body(raw: bytes) -> Any:
    try:
        return json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        raise UnparseableNotice("The body is not JSON.") from None


# --- webhooks ----------------------------------------------------------------------------


class WebhookView(APIView):
    """POST a cloud's own document, signed: X-Signature: sha256=<hex HMAC of the raw body>."""

    authentication_classes = [WebhookSignatureAuthentication]
    permission_classes = [AllowAny]  # the authentication refuses any request it cannot verify
    throttle_classes = [WebhookRateThrottle]
    source: str = ""

    def post(self, request: Request) -> Response:
        # request.body: the signature covers the bytes as sent, not a re-encoding of them.
        document = None
        try:
            document = _json_body(request.body)
        except UnparseableNotice:
            if services.policy_for(self.source).mode != "off":
                raise
        return reply(services.receive(source=self.source, document=document, via=Via.WEBHOOK))


def _webhook(source: str, summary: str) -> type[WebhookView]:
    def post(self: WebhookView, request: Request) -> Response:
        return WebhookView.post(self, request)

    schema = extend_schema(
        operation_id=f"preemption_{source}",
        summary=summary,
        request=OpenApiTypes.OBJECT,
        responses={202: NoticeReplySerializer},
        tags=["preemption"],
    )
    return type(f"{source.title()}WebhookView", (WebhookView,), {"source": source, "post": schema(post)})


AwsWebhookView = _webhook(Source.AWS, "An EventBridge spot interruption warning or rebalance recommendation")
AzureWebhookView = _webhook(Source.AZURE, "An Azure Scheduled Events document (Preempt events)")
GcpWebhookView = _webhook(Source.GCP, "A Pub/Sub push of a compute.instances.preempted audit log entry")
GenericWebhookView = _webhook(Source.GENERIC, "{event_id, instance_id | node_id, action, not_before?}")


# --- agent -------------------------------------------------------------------------------


class AgentNoticeSerializer(serializers.Serializer):
    source = serializers.ChoiceField(choices=Source.choices)
    document = serializers.JSONField(help_text="What the agent read from its cloud's metadata service, as read.")


class AgentNoticeView(APIView):
    authentication_classes = [AgentTokenAuthentication]
    permission_classes = [IsAgent]
    throttle_classes = [AgentRateThrottle]

    @extend_schema(request=AgentNoticeSerializer, responses={202: NoticeReplySerializer}, tags=["agent"])
    def post(self, request: Request) -> Response:
        check_size(request)
        data = AgentNoticeSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        receipt = services.receive(
            source=data.validated_data["source"], document=data.validated_data["document"], via=Via.AGENT, node=request.auth
        )
        return reply(receipt)


# --- pools ---------------------------------------------------------------------------------


class CapacityPoolSerializer(serializers.Serializer):
    cloud = serializers.CharField()
    instance_type = serializers.CharField()
    zone = serializers.CharField()
    nodes = serializers.IntegerField()
    spot_nodes = serializers.IntegerField()
    spot_node_hours = serializers.FloatField(help_text="Listing to last heartbeat, summed over the pool's spot nodes.")
    interruptions = serializers.IntegerField(help_text="Reclaims of every trigger but rental_start, plus shadow records.")
    interruptions_30d = serializers.IntegerField()
    shadow_interruptions = serializers.IntegerField()
    mtbi_hours = serializers.FloatField(allow_null=True, help_text="spot_node_hours / interruptions; null until one.")
    drains_clean = serializers.IntegerField(help_text="Drains that finished with nothing cut.")
    requests_cut = serializers.IntegerField()
    at_risk = serializers.BooleanField(help_text="A node of the pool carries a rebalance recommendation.")
    spot_price_per_hour = serializers.FloatField(allow_null=True)
    on_demand_price_per_hour = serializers.FloatField(allow_null=True)
    realised_discount = serializers.FloatField(allow_null=True)


class PoolListView(APIView):
    permission_classes = [IsUser]

    @extend_schema(responses=CapacityPoolSerializer(many=True), tags=["insight"])
    def get(self, request: Request) -> Response:
        return Response(CapacityPoolSerializer(pool_stats(), many=True).data)


# --- economics -------------------------------------------------------------------------------


class EconomicsQuerySerializer(serializers.Serializer):
    on_demand_price = serializers.FloatField(min_value=0)
    discount = serializers.FloatField(min_value=0, max_value=1, help_text="0.7: spot costs 30 % of on-demand.")
    mtbi_hours = serializers.FloatField(
        min_value=0, required=False, help_text="Default: the measured MTBI of the pool given by cloud, instance_type, zone."
    )
    checkpoint_hours = serializers.FloatField(min_value=0)
    restart_hours = serializers.FloatField(min_value=0)
    work_hours = serializers.FloatField(min_value=0)
    interval_hours = serializers.FloatField(min_value=0, required=False, help_text="Default: T_opt = sqrt(2 C M).")
    cloud = serializers.CharField(required=False, allow_blank=True)
    instance_type = serializers.CharField(required=False, allow_blank=True)
    zone = serializers.CharField(required=False, allow_blank=True)

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        errors: dict[str, list[str]] = {}
        if attrs.get("mtbi_hours") is None:
            pool_given = any(attrs.get(k) for k in ("cloud", "instance_type", "zone"))
            stats = find_pool(cloud=attrs.get("cloud", ""), instance_type=attrs.get("instance_type", ""), zone=attrs.get("zone", "")) if pool_given else None
            if stats is None or stats.mtbi_hours is None:
                errors["mtbi_hours"] = [
                    "This field is required, unless cloud, instance_type and zone name a pool with a measured MTBI."
                    if not pool_given
                    else "That pool has no measured interruption yet: give mtbi_hours."
                ]
            else:
                attrs["mtbi_hours"] = stats.mtbi_hours
                attrs["pool"] = stats
        if attrs.get("mtbi_hours") == 0:
            errors["mtbi_hours"] = ["Must be greater than 0."]
        if attrs.get("work_hours") == 0:
            errors["work_hours"] = ["Must be greater than 0."]
        if attrs.get("interval_hours") == 0:
            errors["interval_hours"] = ["Must be greater than 0."]
        if errors:
            raise ValidationError(errors)
        return attrs


class EconomicsResultSerializer(serializers.Serializer):
    wall_clock_hours = serializers.FloatField(allow_null=True)
    cost_spot = serializers.FloatField(allow_null=True)
    cost_on_demand = serializers.FloatField()
    cost_ratio = serializers.FloatField(allow_null=True)
    effective_discount = serializers.FloatField(allow_null=True)
    optimal_interval_hours = serializers.FloatField()
    progress_rate = serializers.FloatField()
    no_net_progress = serializers.BooleanField()
    message = serializers.CharField()
    inputs = serializers.DictField(help_text="The inputs the result came from, the interval and MTBI used included.")


def economics_inputs(data: dict[str, Any]) -> economics.Inputs:
    return economics.Inputs(
        on_demand_price=data["on_demand_price"],
        discount=data["discount"],
        mtbi_hours=data["mtbi_hours"],
        checkpoint_hours=data["checkpoint_hours"],
        restart_hours=data["restart_hours"],
        work_hours=data["work_hours"],
        interval_hours=data.get("interval_hours"),
    )


def economics_result(data: dict[str, Any]) -> dict[str, Any]:
    result = economics.compute(economics_inputs(data)).as_dict()
    pool: PoolStats | None = data.get("pool")
    result["inputs"]["mtbi_source"] = (
        f"measured in pool {pool.label}: {pool.spot_node_hours:.1f} spot node-hours / {pool.interruptions} interruptions"
        if pool
        else "given"
    )
    return result


def _finite(value: Any) -> bool:
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, dict):
        return all(_finite(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return all(_finite(v) for v in value)
    return True


class EconomicsView(APIView):
    permission_classes = [IsUser]

    @extend_schema(
        parameters=[
            OpenApiParameter(name, float, required=name not in ("mtbi_hours", "interval_hours"))
            for name in (
                "on_demand_price", "discount", "mtbi_hours", "checkpoint_hours", "restart_hours", "work_hours", "interval_hours",
            )
        ]
        + [OpenApiParameter(name, str, required=False) for name in ("cloud", "instance_type", "zone")],
        responses=EconomicsResultSerializer,
        tags=["insight"],
    )
    def get(self, request: Request) -> Response:
        query = EconomicsQuerySerializer(data=request.query_params)
        query.is_valid(raise_exception=True)
        result = economics_result(query.validated_data)
        if not _finite(result):
            # Valid numbers whose arithmetic overflows (1e308 $/h): JSON has no inf, and this is the input's fault.
            return Response(
                {"code": "out_of_range", "detail": "These inputs overflow the calculation; use realistic magnitudes."},
                status=status.HTTP_400_BAD_REQUEST,
            )
        return Response(EconomicsResultSerializer(result).data)


api_v1_paths = [
    path("preemption/aws", AwsWebhookView.as_view()),
    path("preemption/azure", AzureWebhookView.as_view()),
    path("preemption/gcp", GcpWebhookView.as_view()),
    path("preemption/generic", GenericWebhookView.as_view()),
    path("agent/notices", AgentNoticeView.as_view()),
    path("pools", PoolListView.as_view()),
    path("economics", EconomicsView.as_view()),
]
