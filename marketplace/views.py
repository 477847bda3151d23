"""Portal shell: home, sign-up (log in and out are Django's own views), and the staff page."""

from django import forms
from django.apps import apps
from django.contrib import messages
from django.contrib.auth import get_user_model, login
from django.contrib.auth.decorators import login_required
from django.contrib.auth.forms import UserCreationForm
from django.core.exceptions import PermissionDenied
from django.db.models import F, FloatField, Value
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_GET, require_http_methods

from marketplace.portal import paginate
from rentals.selectors import node_rental_counts, provider_rental_counts


@require_GET
def home(request: HttpRequest) -> HttpResponse:
    if request.user.is_authenticated:
        return redirect("node-list")
    return render(request, "home.html")


class SignUpForm(UserCreationForm):
    email = forms.EmailField(required=False, help_text="Optional; for notices about your nodes and rentals.")

    class Meta(UserCreationForm.Meta):
        model = get_user_model()
        fields = ("username", "email")


@require_http_methods(["GET", "POST"])
def signup(request: HttpRequest) -> HttpResponse:
    """One account is both: list nodes as a provider, rent as a renter."""
    if request.user.is_authenticated:
        return redirect("node-list")
    form = SignUpForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        user = form.save()
        login(request, user, backend="django.contrib.auth.backends.ModelBackend")
        messages.success(request, f"Welcome, {user.username}. Add a node to provide, or rent one from Offers.")
        return redirect("node-list")
    return render(request, "registration/signup.html", {"form": form}, status=400 if form.is_bound else 200)


def with_scores(queryset, relation: str):
    """The reputation app's scores when it is installed (R11), else an empty column."""
    if apps.is_installed("reputation"):
        queryset = queryset.annotate(score=F(f"{relation}__score"))
        if relation == "reputation" and queryset.model is get_user_model():
            queryset = queryset.annotate(standing=F("reputation__standing"))
        return queryset
    return queryset.annotate(score=Value(None, output_field=FloatField()))


@login_required
@require_GET
def staff(request: HttpRequest) -> HttpResponse:
    if not request.user.is_staff:
        raise PermissionDenied("Staff only.")
    providers = paginate(request, with_scores(provider_rental_counts(), "reputation"), param="providers")
    nodes = paginate(request, with_scores(node_rental_counts(), "reputation"), param="nodes")
    return render(request, "marketplace/staff.html", {"providers": providers, "nodes": nodes})
