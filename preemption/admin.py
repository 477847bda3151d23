from django.contrib import admin

from preemption.models import NoticeCount, OnDemandPrice, PreemptionNotice, PreemptionPolicy, ShadowReclaim


@admin.register(PreemptionPolicy)
class PreemptionPolicyAdmin(admin.ModelAdmin):
    """Staff switch a cloud between off, shadow and prod here; blank follows PREEMPTION_MODE."""

    list_display = ["source", "mode", "drain_on_rebalance", "updated_at"]
    list_editable = ["mode", "drain_on_rebalance"]


class ReadOnlyAdmin(admin.ModelAdmin):
    """A record of what happened: looked at, never edited."""

    def has_add_permission(self, request, obj=None) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False


@admin.register(PreemptionNotice)
class PreemptionNoticeAdmin(ReadOnlyAdmin):
    list_display = ["received_at", "source", "kind", "instance_id", "node", "mode", "action", "duplicate", "not_before", "via"]
    list_filter = ["source", "kind", "mode", "action", "duplicate", "via"]
    search_fields = ["external_id", "instance_id"]
    raw_id_fields = ["node", "reclaim", "shadow_reclaim"]
    date_hierarchy = "received_at"


@admin.register(ShadowReclaim)
class ShadowReclaimAdmin(ReadOnlyAdmin):
    list_display = ["started_at", "node", "deadline", "in_flight_at_start", "would_cut", "may_cut", "rentals_noticed"]
    raw_id_fields = ["node"]


@admin.register(NoticeCount)
class NoticeCountAdmin(ReadOnlyAdmin):
    list_display = ["source", "kind", "mode", "action", "count"]
    list_filter = ["source", "mode", "action"]


@admin.register(OnDemandPrice)
class OnDemandPriceAdmin(admin.ModelAdmin):
    list_display = ["cloud", "instance_type", "price_per_hour", "updated_at", "updated_by"]
    search_fields = ["cloud", "instance_type"]
    readonly_fields = ["updated_by"]

    def save_model(self, request, obj, form, change) -> None:
        obj.updated_by = request.user
        super().save_model(request, obj, form, change)
