from django.shortcuts import get_object_or_404
from drf_spectacular.utils import extend_schema
from rest_framework import serializers, status
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from inference.keys import create_api_key, revoke_api_key
from inference.models import ApiKey
from marketplace.auth import IsUser


class ApiKeyCreateSerializer(serializers.Serializer):
    name = serializers.CharField(max_length=100, required=False, allow_blank=True, default="")


class ApiKeySerializer(serializers.ModelSerializer):
    class Meta:
        model = ApiKey
        fields = ["id", "name", "prefix", "created_at", "revoked_at"]


class ApiKeyCreatedSerializer(ApiKeySerializer):
    key = serializers.CharField()

    class Meta(ApiKeySerializer.Meta):
        fields = ApiKeySerializer.Meta.fields + ["key"]


class ApiKeyListView(APIView):
    permission_classes = [IsUser]

    @extend_schema(responses=ApiKeySerializer(many=True))
    def get(self, request: Request) -> Response:
        return Response(ApiKeySerializer(ApiKey.objects.filter(user=request.user), many=True).data)

    @extend_schema(request=ApiKeyCreateSerializer, responses={201: ApiKeyCreatedSerializer})
    def post(self, request: Request) -> Response:
        data = ApiKeyCreateSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        key, raw = create_api_key(user=request.user, name=data.validated_data["name"])
        key.key = raw  # shown in this response only
        return Response(ApiKeyCreatedSerializer(key).data, status=status.HTTP_201_CREATED)


class ApiKeyDetailView(APIView):
    permission_classes = [IsUser]

    @extend_schema(responses={200: ApiKeySerializer})
    def delete(self, request: Request, key_id: int) -> Response:
        key = get_object_or_404(ApiKey.objects.filter(user=request.user), pk=key_id)
        return Response(ApiKeySerializer(revoke_api_key(key=key)).data)
