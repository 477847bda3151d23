"""Renter endpoints and the IMDS-compatible notice endpoint (R13)."""

import math

from django.db.models import Q
from django.http import Http404, HttpRequest, JsonResponse
from django.shortcuts import get_object_or_404
from django.views.decorators.http import require_GET
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import serializers, status
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from marketplace.auth import IsUser
from marketplace.errors import NodeUnavailable
from nodes.models import Node
from nodes.selectors import offers
from rentals import services
from rentals.models import EndReason, Rental
from rentals.serializers import OfferSerializer, RentalCreateSerializer, RentalSerializer


class OfferListView(APIView):
    permission_classes = [IsUser]

    @extend_schema(
        parameters=[
            OpenApiParameter("gpu_model", str, required=False),
            OpenApiParameter("is_spot", bool, required=False),
            OpenApiParameter("max_price", float, required=False),
        ],
        responses=OfferSerializer(many=True),
    )
    def get(self, request: Request) -> Response:
        queryset = offers(viewer=request.user)
        params = request.query_params
        query = OfferQuerySerializer(data={k: params[k] for k in ("gpu_model", "max_price") if params.get(k)})
        query.is_valid(raise_exception=True)  # a NUL byte or a non-finite price is a 400, not a 500
        if query.validated_data.get("gpu_model"):
            queryset = queryset.filter(gpu_model__iexact=query.validated_data["gpu_model"])
        if params.get("is_spot") in ("true", "false"):
            queryset = queryset.filter(is_spot=params["is_spot"] == "true")
        if query.validated_data.get("max_price") is not None:
            queryset = queryset.filter(price_per_hour__lte=query.validated_data["max_price"])
        return Response(OfferSerializer(queryset[:1000], many=True).data)


class OfferQuerySerializer(serializers.Serializer):
    gpu_model = serializers.CharField(max_length=64, required=False)
    max_price = serializers.FloatField(required=False, error_messages={"invalid": "A number."})

    def validate_max_price(self, value: float) -> float:
        if not math.isfinite(value):
            raise serializers.ValidationError("A number.")
        return value


def visible_rentals(user):
    """A renter sees their rentals; a provider sees the rentals of their nodes."""
    return Rental.objects.filter(Q(renter=user) | Q(node__provider=user))


class RentalListView(APIView):
    permission_classes = [IsUser]

    @extend_schema(responses=RentalSerializer(many=True))
    def get(self, request: Request) -> Response:
        rentals = visible_rentals(request.user).order_by("-started_at", "-id")[:500]
        return Response(RentalSerializer(rentals, many=True, context={"request": request}).data)

    @extend_schema(request=RentalCreateSerializer, responses={201: RentalSerializer})
    def post(self, request: Request) -> Response:
        data = RentalCreateSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        if not Node.objects.filter(pk=data.validated_data["node"]).exists():
            raise NodeUnavailable("No such node.")
        rental = services.start_rental(
            renter=request.user, node_id=data.validated_data["node"], hours=data.validated_data.get("hours")
        )
        return Response(RentalSerializer(rental, context={"request": request}).data, status=status.HTTP_201_CREATED)


class RentalDetailView(APIView):
    permission_classes = [IsUser]

    @extend_schema(responses=RentalSerializer)
    def get(self, request: Request, rental_id: int) -> Response:
        rental = get_object_or_404(visible_rentals(request.user), pk=rental_id)
        return Response(RentalSerializer(rental, context={"request": request}).data)


class RentalEndView(APIView):
    permission_classes = [IsUser]

    @extend_schema(request=None, responses=RentalSerializer)
    def post(self, request: Request, rental_id: int) -> Response:
        rental = get_object_or_404(visible_rentals(request.user), pk=rental_id)
        reason = EndReason.RENTER if rental.renter_id == request.user.pk else EndReason.PROVIDER
        rental = services.end_rental(rental_id=rental.pk, reason=reason)
        return Response(RentalSerializer(rental, context={"request": request}).data)


@require_GET
def instance_action(request: HttpRequest, notice_token: str) -> JsonResponse:
    """AWS IMDS's spot/instance-action, per rental: 404 until a reclaim is scheduled."""
    rental = Rental.objects.filter(notice_token=notice_token).only("reclaim_at").first()
    if rental is None or rental.reclaim_at is None:
        raise Http404("No reclaim is scheduled.")
    when = rental.reclaim_at.strftime("%Y-%m-%dT%H:%M:%SZ")
    return JsonResponse({"action": "terminate", "time": when})
