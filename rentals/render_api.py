from django.shortcuts import get_object_or_404
from drf_spectacular.utils import extend_schema
from rest_framework import serializers, status
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from marketplace.auth import IsUser
from rentals.models import RenderJob
from rentals.render import create_render_job, parse_frames


class RenderJobCreateSerializer(serializers.Serializer):
    frames = serializers.CharField(max_length=200)

    def validate_frames(self, value: str) -> str:
        try:
            parse_frames(value)
        except ValueError as exc:
            raise serializers.ValidationError(str(exc)) from None
        return value


class RenderJobSerializer(serializers.ModelSerializer):
    class Meta:
        model = RenderJob
        fields = ["id", "frames", "frame_count", "status", "node", "created_at", "started_at", "finished_at", "detail"]


class RenderJobListView(APIView):
    permission_classes = [IsUser]

    @extend_schema(responses=RenderJobSerializer(many=True))
    def get(self, request: Request) -> Response:
        jobs = RenderJob.objects.filter(renter=request.user).order_by("-created_at")[:500]
        return Response(RenderJobSerializer(jobs, many=True).data)

    @extend_schema(request=RenderJobCreateSerializer, responses={201: RenderJobSerializer})
    def post(self, request: Request) -> Response:
        data = RenderJobCreateSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        job = create_render_job(renter=request.user, frames=data.validated_data["frames"])
        job.refresh_from_db()
        return Response(RenderJobSerializer(job).data, status=status.HTTP_201_CREATED)


class RenderJobDetailView(APIView):
    permission_classes = [IsUser]

    @extend_schema(responses=RenderJobSerializer)
    def get(self, request: Request, job_id: int) -> Response:
        job = get_object_or_404(RenderJob.objects.filter(renter=request.user), pk=job_id)
        return Response(RenderJobSerializer(job).data)
