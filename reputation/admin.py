from django.contrib import admin
from django.urls import reverse
from django.utils.html import format_html

from reputation.models import NodeReputation, ProviderReputation, Standing, StandingChange
from reputation.services import set_standing


@admin.register(ProviderReputation)
class ProviderReputationAdmin(admin.ModelAdmin):
    list_display = ["provider", "score", "counted", "successes", "failures", "spot_left_out", "standing", "rentals_link", "updated_at"]
    list_filter = ["standing"]
    search_fields = ["provider__username"]
    readonly_fields = ["provider", "score", "successes", "failures", "spot_left_out", "standing", "reinstated_at", "updated_at"]
    actions = ["reinstate", "delist"]
    ordering = ["score"]

    @admin.display(description="rentals behind the score")
    def rentals_link(self, rep: ProviderReputation) -> str:
        url = reverse("admin:rentals_rental_changelist") + f"?node__provider__id__exact={rep.provider_id}&status__exact=ended"
        return format_html('<a href="{}">rentals</a>', url)

    @admin.action(description="Reinstate the selected providers")
    def reinstate(self, request, queryset) -> None:
        for rep in queryset:
            set_standing(provider_id=rep.provider_id, standing=Standing.LISTED, by=request.user, reason="reinstated by staff in the admin")

    @admin.action(description="Delist the selected providers")
    def delist(self, request, queryset) -> None:
        for rep in queryset:
            set_standing(provider_id=rep.provider_id, standing=Standing.DELISTED, by=request.user, reason="delisted by staff in the admin")


@admin.register(NodeReputation)
class NodeReputationAdmin(admin.ModelAdmin):
    list_display = ["node", "score", "successes", "failures", "spot_left_out", "updated_at"]
    raw_id_fields = ["node"]


@admin.register(StandingChange)
class StandingChangeAdmin(admin.ModelAdmin):
    list_display = ["at", "provider", "standing", "changed_by", "reason", "score"]
    list_filter = ["standing"]
