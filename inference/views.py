"""API keys page: create (the key is shown once) and revoke, through inference.keys."""

from django import forms
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_http_methods, require_POST

from inference.keys import create_api_key, revoke_api_key
from inference.models import ApiKey


class ApiKeyForm(forms.Form):
    name = forms.CharField(max_length=100, required=False)


@login_required
@never_cache
@require_http_methods(["GET", "POST"])
def api_keys(request: HttpRequest) -> HttpResponse:
    form = ApiKeyForm(request.POST or None)
    created = None
    if request.method == "POST" and form.is_valid():
        key, raw = create_api_key(user=request.user, name=form.cleaned_data["name"])
        created = {"key": key, "raw": raw, "base_url": request.build_absolute_uri("/v1")}
        form = ApiKeyForm()
    keys = ApiKey.objects.filter(user=request.user)[:200]
    return render(request, "inference/keys.html", {"form": form, "keys": keys, "created": created}, status=201 if created else 200)


@login_required
@require_POST
def api_key_revoke(request: HttpRequest, key_id: int) -> HttpResponse:
    key = get_object_or_404(ApiKey.objects.filter(user=request.user), pk=key_id)
    revoke_api_key(key=key)
    messages.success(request, f"Key {key.prefix}… is revoked; it stops working within seconds.")
    return redirect(reverse("api-keys"))
