from django.contrib import admin

from inference.models import ApiKey, RequestLog


@admin.register(ApiKey)
class ApiKeyAdmin(admin.ModelAdmin):
    list_display = ["prefix", "name", "user", "created_at", "revoked_at"]
    readonly_fields = ["prefix", "key_hash", "created_at"]


@admin.register(RequestLog)
class RequestLogAdmin(admin.ModelAdmin):
    list_display = ["created_at", "request_id", "model", "node_id", "is_spot", "outcome", "status_code", "ttft_ms", "duration_ms"]
    list_filter = ["outcome", "is_spot", "stream"]
    search_fields = ["request_id"]
