"""Reputation pages: a provider's own score and what moved it; staff delist and reinstate."""

from django.contrib import messages
from django.contrib.admin.views.decorators import staff_member_required
from django.contrib.auth import get_user_model
from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_POST

from reputation.api import rentals_behind
from reputation.models import ProviderReputation, Standing, StandingChange
from reputation.scoring import outcome, smoothed
from reputation.services import set_standing


@login_required
def my_reputation(request: HttpRequest) -> HttpResponse:
    rep = ProviderReputation.objects.filter(provider=request.user).first()
    rentals = [
        (rental, outcome(is_spot=rental.is_spot, end_reason=rental.end_reason) or "left out")
        for rental in rentals_behind(request.user.pk).select_related("node")[:100]
    ]
    return render(
        request,
        "reputation/mine.html",
        {
            "rep": rep,
            "fresh_score": smoothed(0, 0),
            "rentals": rentals,
            "changes": StandingChange.objects.filter(provider=request.user)[:20],
        },
    )


@staff_member_required
@require_POST
def change_standing(request: HttpRequest, provider_id: int) -> HttpResponse:
    provider = get_object_or_404(get_user_model(), pk=provider_id)
    standing = request.POST.get("standing")
    reason = (request.POST.get("reason") or "").strip()
    if standing not in (Standing.LISTED, Standing.DELISTED) or not reason:
        messages.error(request, "Say why: a standing change needs a reason.")
        return redirect("staff")
    set_standing(provider_id=provider.pk, standing=standing, by=request.user, reason=reason[:500])
    messages.success(request, f"{provider.username} is now {standing}.")
    return redirect("staff")
