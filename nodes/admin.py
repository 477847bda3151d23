from django.contrib import admin

from nodes.models import Command, Node, NodeEvent, Reclaim, RouterInstance, ServedModel, Slot, Worker


@admin.register(Node)
class NodeAdmin(admin.ModelAdmin):
    list_display = ["id", "name", "provider", "is_spot", "workload_enabled", "gpu_model", "cloud", "zone", "last_seen_at"]
    list_filter = ["is_spot", "workload_enabled", "cloud"]
    search_fields = ["name", "cloud_instance_id", "provider__username"]
    readonly_fields = ["agent_token_hash", "last_seen_at", "created_at"]
    list_select_related = ["provider"]


@admin.register(ServedModel)
class ServedModelAdmin(admin.ModelAdmin):
    list_display = ["name", "min_vram_gb", "typical_tokens_per_s", "target_replicas", "max_slots"]


@admin.register(Worker)
class WorkerAdmin(admin.ModelAdmin):
    list_display = ["id", "node", "model", "status", "in_flight", "max_slots", "expires_at", "drain_deadline", "stop_reason"]
    list_filter = ["status", "stop_reason", "model"]
    list_select_related = ["node", "model"]
    raw_id_fields = ["node", "reclaim"]


@admin.register(Command)
class CommandAdmin(admin.ModelAdmin):
    list_display = ["id", "node", "kind", "created_at", "delivery_count", "acked_at", "ok"]
    list_filter = ["kind", "ok"]
    raw_id_fields = ["node", "worker"]


class NodeEventInline(admin.TabularInline):
    model = NodeEvent
    extra = 0
    fields = ["at", "kind", "worker", "data"]
    readonly_fields = fields
    can_delete = False


@admin.register(Reclaim)
class ReclaimAdmin(admin.ModelAdmin):
    list_display = ["id", "node", "trigger", "started_at", "deadline", "finished_at", "in_flight_at_start", "completed", "cut"]
    list_filter = ["trigger"]
    raw_id_fields = ["node"]
    inlines = [NodeEventInline]


@admin.register(NodeEvent)
class NodeEventAdmin(admin.ModelAdmin):
    list_display = ["at", "node", "kind", "worker", "reclaim"]
    list_filter = ["kind"]
    raw_id_fields = ["node", "worker", "reclaim"]


admin.site.register(Slot)
admin.site.register(RouterInstance)
