"""Renter pages: Offers, rent, My rentals with the reclaim banner and notice URL, end a rental.

The same services as the API (rentals.services.start_rental / end_rental); a
refusal (NodeUnavailable, RentalEnded) is a message and a 409.
"""

import hashlib

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.views.decorators.http import require_GET, require_POST

from marketplace.errors import DomainError
from marketplace.portal import domain_error, paginate, paginate_ids
from nodes.selectors import offer_gpu_models, offer_rows, offers
from rentals import services
from rentals.forms import OfferFilterForm, RentForm
from rentals.models import EndReason
from rentals.selectors import ended_rentals, open_rentals, renter_rentals

OPEN_SHOWN = 50


def notice_url(request: HttpRequest, notice_token: str) -> str:
    return request.build_absolute_uri(f"/meta/{notice_token}/latest/meta-data/spot/instance-action")


def offers_context(request: HttpRequest) -> dict:
    form = OfferFilterForm(request.GET or None, gpu_models=offer_gpu_models())
    rentable = form.apply(offers(viewer=request.user))
    page = paginate_ids(request, rentable)
    return {"form": form, "page": page, "offers": offer_rows(rentable, list(page.object_list))}


@login_required
@require_GET
def offer_list(request: HttpRequest) -> HttpResponse:
    context = offers_context(request)
    if request.htmx and request.htmx.target == "offer-list":
        return render(request, "rentals/_offer_list.html", context)
    return render(request, "rentals/offers.html", context)


@login_required
@require_POST
def rent(request: HttpRequest, node_id: int) -> HttpResponse:
    form = RentForm(request.POST)
    if not form.is_valid():
        messages.error(request, "Hours must be a number between 0.01 and 8760, or empty for no end.")
        return render(request, "rentals/offers.html", offers_context(request), status=400)
    try:
        rental = services.start_rental(renter=request.user, node_id=node_id, hours=form.cleaned_data.get("hours"))
    except DomainError as exc:
        return domain_error(request, exc, partial=None, page="rentals/offers.html", context=lambda: offers_context(request))
    messages.success(request, f"You rented {rental.node.name}.")
    return redirect(reverse("rental-detail", args=[rental.pk]))


def fingerprint(rental) -> str:
    """Changes whenever the status part would; a poll that sends the current one gets a 204."""
    seen = f"{rental.status}|{rental.reclaim_at}|{rental.ended_at}|{rental.end_reason}"
    return hashlib.blake2b(seen.encode(), digest_size=8).hexdigest()


def status_context(request: HttpRequest, rental) -> dict:
    return {"rental": rental, "notice_url": notice_url(request, rental.notice_token), "fingerprint": fingerprint(rental)}


@login_required
@require_GET
def rental_list(request: HttpRequest) -> HttpResponse:
    current = list(open_rentals(renter=request.user)[:OPEN_SHOWN])
    page = paginate(request, ended_rentals(renter=request.user))
    cards = [status_context(request, rental) for rental in current]
    return render(request, "rentals/list.html", {"cards": cards, "page": page})


@login_required
@require_GET
def rental_detail(request: HttpRequest, rental_id: int) -> HttpResponse:
    """A rental's page; htmx polls its status part while it is open."""
    rental = get_object_or_404(renter_rentals(renter=request.user), pk=rental_id)
    context = status_context(request, rental)
    if request.htmx:
        if request.GET.get("seen") == context["fingerprint"]:
            return HttpResponse(status=204)  # unchanged: htmx swaps nothing
        return render(request, "rentals/_rental_status.html", context)
    return render(request, "rentals/detail.html", context)


@login_required
@require_POST
def rental_end(request: HttpRequest, rental_id: int) -> HttpResponse:
    rental = get_object_or_404(renter_rentals(renter=request.user), pk=rental_id)
    try:
        services.end_rental(rental_id=rental.pk, reason=EndReason.RENTER)
    except DomainError as exc:
        return domain_error(
            request, exc, partial=None, page="rentals/detail.html",
            context=lambda: status_context(request, get_object_or_404(renter_rentals(renter=request.user), pk=rental_id)),
        )
    messages.success(request, f"Rental #{rental.pk} of {rental.node.name} ended.")
    return redirect(reverse("rental-list"))
