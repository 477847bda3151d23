"""Provider and agent endpoints of API.md: validate, call one service, serialize."""

from typing import Any

from django.db.models import Prefetch
from django.shortcuts import get_object_or_404
from drf_spectacular.utils import extend_schema, inline_serializer
from rest_framework import serializers, status
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from marketplace.auth import AgentTokenAuthentication, IsAgent, IsUser
from marketplace.throttles import AgentRateThrottle
from nodes import heartbeats, services
from nodes.commands import ack_command
from nodes.models import Node, NodeEvent, Reclaim, Worker
from nodes.selectors import provider_nodes
from nodes.serializers import (
    NodeCreatedSerializer,
    NodeCreateSerializer,
    NodeSerializer,
    NodeUpdateSerializer,
    PausedNodeSerializer,
    ReclaimSerializer,
)


def own_node(request: Request, node_id: int) -> Node:
    # Another provider's node answers exactly like a missing one (R14).
    return get_object_or_404(provider_nodes(provider=request.user), pk=node_id)


class NodeListView(APIView):
    permission_classes = [IsUser]

    @extend_schema(responses=NodeSerializer(many=True))
    def get(self, request: Request) -> Response:
        return Response(NodeSerializer(provider_nodes(provider=request.user), many=True).data)

    @extend_schema(request=NodeCreateSerializer, responses={201: NodeCreatedSerializer})
    def post(self, request: Request) -> Response:
        data = NodeCreateSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        node, token = services.create_node(provider=request.user, **data.validated_data)
        node = own_node(request, node.pk)
        node.agent_token = token
        return Response(NodeCreatedSerializer(node).data, status=status.HTTP_201_CREATED)


class NodeDetailView(APIView):
    permission_classes = [IsUser]

    @extend_schema(responses=NodeSerializer)
    def get(self, request: Request, node_id: int) -> Response:
        return Response(NodeSerializer(own_node(request, node_id)).data)

    @extend_schema(request=NodeUpdateSerializer, responses=NodeSerializer)
    def patch(self, request: Request, node_id: int) -> Response:
        node = own_node(request, node_id)
        data = NodeUpdateSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        fields = data.validated_data
        if "is_spot" in fields:
            services.set_spot(node_id=node.pk, is_spot=fields["is_spot"])
        services.update_node(node=node, name=fields.get("name"), price_per_hour=fields.get("price_per_hour"))
        return Response(NodeSerializer(own_node(request, node_id)).data)


class NodePauseView(APIView):
    permission_classes = [IsUser]

    @extend_schema(request=None, responses={202: PausedNodeSerializer})
    def post(self, request: Request, node_id: int) -> Response:
        node = own_node(request, node_id)
        _, reclaim = services.pause_node(node_id=node.pk)
        data = PausedNodeSerializer(own_node(request, node_id), context={"reclaim": reclaim}).data
        return Response(data, status=status.HTTP_202_ACCEPTED)


class NodeResumeView(APIView):
    permission_classes = [IsUser]

    @extend_schema(request=None, responses=NodeSerializer)
    def post(self, request: Request, node_id: int) -> Response:
        node = own_node(request, node_id)
        services.resume_node(node_id=node.pk)
        return Response(NodeSerializer(own_node(request, node_id)).data)


class NodeReclaimsView(APIView):
    permission_classes = [IsUser]

    @extend_schema(responses=ReclaimSerializer(many=True))
    def get(self, request: Request, node_id: int) -> Response:
        node = own_node(request, node_id)
        reclaims = Reclaim.objects.filter(node=node).prefetch_related(
            Prefetch("workers", queryset=Worker.objects.order_by("drain_started_at", "pk")),
            Prefetch("events", queryset=NodeEvent.objects.order_by("at", "pk")),
        )[:100]
        return Response(ReclaimSerializer(reclaims, many=True).data)


# --- Agent -------------------------------------------------------------------


class HardwareSerializer(serializers.Serializer):
    gpu_model = serializers.CharField(max_length=64, required=False, allow_blank=True)
    gpu_count = serializers.IntegerField(min_value=0, max_value=1024, required=False)
    vram_gb = serializers.IntegerField(min_value=0, max_value=100000, required=False)

    def to_internal_value(self, data):
        if isinstance(data, dict):
            data = {k: v for k, v in data.items() if v is not None}
        return super().to_internal_value(data)


class CloudSerializer(serializers.Serializer):
    # Agents off any cloud send nulls for what they cannot know: accepted, ignored.
    provider = serializers.CharField(max_length=32, required=False, allow_blank=True, allow_null=True)
    instance_id = serializers.CharField(max_length=128, required=False, allow_blank=True, allow_null=True)
    instance_type = serializers.CharField(max_length=64, required=False, allow_blank=True, allow_null=True)
    region = serializers.CharField(max_length=64, required=False, allow_blank=True, allow_null=True)
    zone = serializers.CharField(max_length=64, required=False, allow_blank=True, allow_null=True)


class HelloSerializer(serializers.Serializer):
    hardware = HardwareSerializer(required=False, default=dict)
    cloud = CloudSerializer(required=False, default=dict)
    workers = serializers.ListField(child=serializers.UUIDField(), required=False, default=list)


class CommandSerializer(serializers.Serializer):
    id = serializers.UUIDField()
    kind = serializers.CharField()
    payload = serializers.DictField()


class HeartbeatWorkerSerializer(serializers.Serializer):
    id = serializers.UUIDField()
    status = serializers.CharField(max_length=16)
    in_flight = serializers.IntegerField(min_value=0, required=False, default=0)


class HeartbeatRentalSerializer(serializers.Serializer):
    id = serializers.IntegerField()
    status = serializers.CharField(max_length=16)


class HeartbeatSerializer(serializers.Serializer):
    workers = HeartbeatWorkerSerializer(many=True, required=False, default=list)
    rentals = HeartbeatRentalSerializer(many=True, required=False, default=list)


class WorkerRegisterSerializer(serializers.Serializer):
    model = serializers.CharField(max_length=128)
    endpoint = serializers.URLField(max_length=255)
    max_slots = serializers.IntegerField(min_value=1, max_value=4096)
    worker_id = serializers.UUIDField(required=False, allow_null=True)


class AckSerializer(serializers.Serializer):
    ok = serializers.BooleanField()
    detail = serializers.CharField(max_length=2000, required=False, allow_blank=True, default="")
    interrupted = serializers.IntegerField(min_value=0, required=False, allow_null=True, default=None)


class AgentView(APIView):
    authentication_classes = [AgentTokenAuthentication]
    permission_classes = [IsAgent]
    throttle_classes = [AgentRateThrottle]

    def valid(self, serializer_class: type[serializers.Serializer], request: Request) -> dict[str, Any]:
        data = serializer_class(data=request.data)
        data.is_valid(raise_exception=True)
        return data.validated_data


class AgentHelloView(AgentView):
    @extend_schema(
        request=HelloSerializer,
        responses=inline_serializer(
            "HelloReply",
            {"node_id": serializers.IntegerField(), "heartbeat_interval_s": serializers.FloatField(), "commands": CommandSerializer(many=True)},
        ),
    )
    def post(self, request: Request) -> Response:
        data = self.valid(HelloSerializer, request)
        reply = heartbeats.hello(
            node=request.auth, hardware=data["hardware"], cloud=data["cloud"], running_worker_ids=data["workers"]
        )
        return Response(reply)


class AgentHeartbeatView(AgentView):
    # Never limited: every reply carries the stop commands of a drain (README, Operations).
    throttle_classes: list = []

    @extend_schema(
        request=HeartbeatSerializer,
        responses=inline_serializer(
            "HeartbeatReply",
            {
                "workers": inline_serializer(
                    "HeartbeatWorkerReply",
                    {"id": serializers.UUIDField(), "status": serializers.CharField(), "expires_at": serializers.DateTimeField(allow_null=True)},
                    many=True,
                ),
                "commands": CommandSerializer(many=True),
                "heartbeat_interval_s": serializers.FloatField(),
            },
        ),
    )
    def post(self, request: Request) -> Response:
        data = self.valid(HeartbeatSerializer, request)
        return Response(heartbeats.heartbeat(node=request.auth, workers=data["workers"]))


class AgentWorkersView(AgentView):
    @extend_schema(
        request=WorkerRegisterSerializer,
        responses={201: inline_serializer("WorkerRegistered", {"id": serializers.UUIDField(), "status": serializers.CharField()})},
    )
    def post(self, request: Request) -> Response:
        data = self.valid(WorkerRegisterSerializer, request)
        worker = heartbeats.register_worker(
            node=request.auth,
            model=data["model"],
            endpoint=data["endpoint"],
            max_slots=data["max_slots"],
            worker_id=data.get("worker_id"),
        )
        return Response({"id": str(worker.pk), "status": worker.status}, status=status.HTTP_201_CREATED)


class AgentCommandAckView(AgentView):
    @extend_schema(
        request=AckSerializer,
        responses=inline_serializer("AckReply", {"id": serializers.UUIDField(), "acked_at": serializers.DateTimeField()}),
    )
    def post(self, request: Request, command_id: Any) -> Response:
        data = self.valid(AckSerializer, request)
        command = ack_command(
            node=request.auth, command_id=command_id, ok=data["ok"], detail=data["detail"], interrupted=data["interrupted"]
        )
        return Response({"id": str(command.pk), "acked_at": command.acked_at})
