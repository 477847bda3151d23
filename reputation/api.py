"""A provider's own score and what moved it; staff lists, delists and reinstates."""

from datetime import timedelta

from django.conf import settings
from django.contrib.auth import get_user_model
from django.shortcuts import get_object_or_404
from django.utils import timezone
from drf_spectacular.utils import extend_schema
from rest_framework import permissions, serializers
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from marketplace.auth import IsUser
from rentals.models import Rental
from reputation.models import ProviderReputation, Standing
from reputation.scoring import outcome, smoothed
from reputation.selectors import provider_scores
from reputation.services import set_standing


class ProviderScoreSerializer(serializers.Serializer):
    provider = serializers.IntegerField(source="provider_id")
    username = serializers.CharField(source="provider.username")
    score = serializers.FloatField()
    counted = serializers.IntegerField()
    successes = serializers.IntegerField()
    failures = serializers.IntegerField()
    spot_left_out = serializers.IntegerField()
    standing = serializers.CharField()
    updated_at = serializers.DateTimeField()


class CountedRentalSerializer(serializers.ModelSerializer):
    counts_as = serializers.SerializerMethodField()

    class Meta:
        model = Rental
        fields = ["id", "node", "is_spot", "started_at", "ended_at", "end_reason", "counts_as"]

    def get_counts_as(self, rental: Rental) -> str:
        return outcome(is_spot=rental.is_spot, end_reason=rental.end_reason) or "left_out"


def rentals_behind(provider_id: int):
    """The ended rentals in the window that the provider's score is made of (spot shown as left out)."""
    since = timezone.now() - timedelta(days=settings.REPUTATION_WINDOW_DAYS)
    return Rental.objects.filter(node__provider_id=provider_id, status="ended", ended_at__gte=since).order_by("-ended_at")


class MyReputationView(APIView):
    permission_classes = [IsUser]

    @extend_schema(responses=ProviderScoreSerializer)
    def get(self, request: Request) -> Response:
        rep = ProviderReputation.objects.select_related("provider").filter(provider=request.user).first()
        if rep is None:
            rep = ProviderReputation(provider=request.user, score=smoothed(0, 0))
        data = dict(ProviderScoreSerializer(rep).data)
        data["rentals"] = CountedRentalSerializer(rentals_behind(request.user.pk)[:100], many=True).data
        return Response(data)


class StandingSerializer(serializers.Serializer):
    reason = serializers.CharField(max_length=500)


class StaffProviderListView(APIView):
    permission_classes = [IsUser, permissions.IsAdminUser]

    @extend_schema(responses=ProviderScoreSerializer(many=True))
    def get(self, request: Request) -> Response:
        return Response(ProviderScoreSerializer(provider_scores()[:1000], many=True).data)


class StaffStandingView(APIView):
    permission_classes = [IsUser, permissions.IsAdminUser]
    standing = Standing.LISTED

    @extend_schema(request=StandingSerializer, responses=ProviderScoreSerializer)
    def post(self, request: Request, provider_id: int) -> Response:
        provider = get_object_or_404(get_user_model(), pk=provider_id)
        data = StandingSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        set_standing(provider_id=provider.pk, standing=self.standing, by=request.user, reason=data.validated_data["reason"])
        return Response(ProviderScoreSerializer(ProviderReputation.objects.select_related("provider").get(provider=provider)).data)


class StaffDelistView(StaffStandingView):
    standing = Standing.DELISTED


class StaffReinstateView(StaffStandingView):
    standing = Standing.LISTED
