from typing import Any

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from nodes.models import Node, Reclaim
from nodes.selectors import node_state


class PoolSerializer(serializers.Serializer):
    cloud = serializers.CharField()
    instance_type = serializers.CharField()
    region = serializers.CharField()
    zone = serializers.CharField()


class WorkerBriefSerializer(serializers.Serializer):
    id = serializers.UUIDField()
    model = serializers.CharField(source="model.name")
    status = serializers.CharField()
    in_flight = serializers.IntegerField()
    max_slots = serializers.IntegerField()
    drain_deadline = serializers.DateTimeField(allow_null=True)


class NodeSerializer(serializers.ModelSerializer):
    state = serializers.SerializerMethodField()
    pool = serializers.SerializerMethodField()
    rented = serializers.BooleanField()
    online = serializers.SerializerMethodField()
    workers = WorkerBriefSerializer(many=True, source="live_workers")

    class Meta:
        model = Node
        fields = [
            "id", "name", "is_spot", "workload_enabled", "state", "price_per_hour",
            "gpu_model", "gpu_count", "vram_gb", "pool", "cloud_instance_id",
            "rented", "online", "last_seen_at", "workers",
        ]

    def get_state(self, node: Node) -> str:
        return node_state(node)

    def get_online(self, node: Node) -> bool:
        return node.is_online()

    @extend_schema_field(PoolSerializer)
    def get_pool(self, node: Node) -> dict[str, str]:
        return pool_of(node)


def pool_of(node: Node) -> dict[str, str]:
    return {"cloud": node.cloud, "instance_type": node.instance_type, "region": node.region, "zone": node.zone}


class NodeCreateSerializer(serializers.Serializer):
    name = serializers.CharField(max_length=100)
    is_spot = serializers.BooleanField(default=False)
    price_per_hour = serializers.DecimalField(max_digits=10, decimal_places=4, min_value=0)
    gpu_model = serializers.CharField(max_length=64, required=False, allow_blank=True)
    gpu_count = serializers.IntegerField(min_value=0, max_value=1024, required=False)
    vram_gb = serializers.IntegerField(min_value=0, max_value=100000, required=False)
    cloud = serializers.CharField(max_length=32, required=False, allow_blank=True)
    instance_type = serializers.CharField(max_length=64, required=False, allow_blank=True)
    region = serializers.CharField(max_length=64, required=False, allow_blank=True)
    zone = serializers.CharField(max_length=64, required=False, allow_blank=True)
    cloud_instance_id = serializers.CharField(max_length=128, required=False, allow_blank=True)


class NodeCreatedSerializer(NodeSerializer):
    agent_token = serializers.CharField()

    class Meta(NodeSerializer.Meta):
        fields = NodeSerializer.Meta.fields + ["agent_token"]


class NodeUpdateSerializer(serializers.Serializer):
    is_spot = serializers.BooleanField(required=False)
    name = serializers.CharField(max_length=100, required=False)
    price_per_hour = serializers.DecimalField(max_digits=10, decimal_places=4, min_value=0, required=False)


class ReclaimBriefSerializer(serializers.Serializer):
    id = serializers.IntegerField()
    deadline = serializers.DateTimeField()


class PausedNodeSerializer(NodeSerializer):
    reclaim = serializers.SerializerMethodField()

    class Meta(NodeSerializer.Meta):
        fields = NodeSerializer.Meta.fields + ["reclaim"]

    @extend_schema_field(ReclaimBriefSerializer(allow_null=True))
    def get_reclaim(self, node: Node) -> dict[str, Any] | None:
        reclaim = self.context.get("reclaim")
        return ReclaimBriefSerializer(reclaim).data if reclaim else None


class ReclaimWorkerSerializer(serializers.Serializer):
    id = serializers.UUIDField()
    stop_reason = serializers.CharField()
    stopped_at = serializers.DateTimeField(allow_null=True)
    drain_started_at = serializers.DateTimeField(allow_null=True)
    in_flight_at_drain = serializers.IntegerField()
    requests_cut = serializers.IntegerField()


class ReclaimEventSerializer(serializers.Serializer):
    at = serializers.DateTimeField()
    kind = serializers.CharField()
    worker = serializers.UUIDField(source="worker_id", allow_null=True)
    data = serializers.JSONField()


class ReclaimSerializer(serializers.ModelSerializer):
    workers = ReclaimWorkerSerializer(many=True)
    timeline = ReclaimEventSerializer(many=True, source="events")

    class Meta:
        model = Reclaim
        fields = [
            "id", "trigger", "started_at", "deadline", "finished_at", "resumed_at",
            "in_flight_at_start", "completed", "cut", "rentals_noticed", "workers", "timeline",
        ]
