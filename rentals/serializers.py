from typing import Any

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from nodes.models import Node
from nodes.serializers import PoolSerializer, pool_of
from rentals.models import Rental


class OfferSerializer(serializers.ModelSerializer):
    pool = serializers.SerializerMethodField()
    reliability = serializers.SerializerMethodField()

    class Meta:
        model = Node
        fields = ["id", "name", "is_spot", "price_per_hour", "gpu_model", "gpu_count", "vram_gb", "pool", "reliability"]

    @extend_schema_field(PoolSerializer)
    def get_pool(self, node: Node) -> dict[str, str]:
        return pool_of(node)

    @extend_schema_field(serializers.FloatField(allow_null=True))
    def get_reliability(self, node: Node) -> float | None:
        return getattr(node, "reliability", None)


class RentalCreateSerializer(serializers.Serializer):
    node = serializers.IntegerField(min_value=1)
    hours = serializers.FloatField(min_value=0.01, max_value=24 * 365, required=False, allow_null=True)


class RentalSerializer(serializers.ModelSerializer):
    notice_url = serializers.SerializerMethodField()

    class Meta:
        model = Rental
        fields = [
            "id", "node", "is_spot", "status", "started_at", "term_ends_at",
            "reclaim_at", "ended_at", "end_reason", "notice_url",
        ]

    @extend_schema_field(serializers.URLField(allow_null=True))
    def get_notice_url(self, rental: Rental) -> str | None:
        request = self.context.get("request")
        # Only the renter's container needs (and may see) the notice token.
        if request is None or rental.renter_id != request.user.pk:
            return None
        return request.build_absolute_uri(f"/meta/{rental.notice_token}/latest/meta-data/spot/instance-action")


def rental_data(rental: Rental, request: Any) -> dict[str, Any]:
    return RentalSerializer(rental, context={"request": request}).data
