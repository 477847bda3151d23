from django.contrib import admin

from rentals.models import Rental, RenderJob


@admin.register(Rental)
class RentalAdmin(admin.ModelAdmin):
    list_display = ["id", "node", "renter", "is_spot", "status", "started_at", "reclaim_at", "ended_at", "end_reason"]
    list_filter = ["status", "is_spot", "end_reason", "node__provider"]
    raw_id_fields = ["node", "renter", "reclaim"]
    readonly_fields = ["is_spot", "notice_token"]


@admin.register(RenderJob)
class RenderJobAdmin(admin.ModelAdmin):
    list_display = ["id", "renter", "frames", "status", "node", "created_at", "finished_at"]
    list_filter = ["status"]
    raw_id_fields = ["renter", "node"]
