"""What every portal view shares: pagination, safe redirects, and domain errors as messages.

Views call the same service functions as the API; a DomainError (NotSpot,
NodeRented, NodeUnavailable, ...) becomes a message on the page with the
error's own status (409 for conflicts), never a 500. An htmx request gets the
named partial with the messages swapped in out of band; a plain form post gets
the full page.
"""

import math
from typing import Any

from django.contrib import messages
from django.core.paginator import Page, Paginator
from django.db.models import Count, Window
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import render
from django.utils.http import url_has_allowed_host_and_scheme

from marketplace.errors import DomainError

PAGE_SIZE = 50


def paginate(request: HttpRequest, queryset: Any, per_page: int = PAGE_SIZE, param: str = "page") -> Page:
    """One COUNT and one page of rows, whatever the table's size; a bad page number gives page 1 or the last."""
    return Paginator(queryset, per_page).get_page(request.GET.get(param))


def paginate_ids(request: HttpRequest, queryset: Any, per_page: int = PAGE_SIZE, param: str = "page") -> Page:
    """A page of primary keys and the total in one query (COUNT(*) OVER ()), for lists whose
    filter must look at every row anyway (the offers: sorted by price over the whole fleet).

    Paginator would scan twice, once to COUNT and once for the page. The page's
    object_list holds ids; a number past the end gives the last page, as get_page does.
    """
    try:
        number = max(1, int(request.GET.get(param) or 1))
    except ValueError:
        number = 1
    counted = queryset.annotate(_total=Window(Count("pk"))).values_list("pk", "_total")
    rows = list(counted[(number - 1) * per_page : number * per_page])
    if not rows and number > 1:
        number = max(1, math.ceil(queryset.count() / per_page))
        rows = list(counted[(number - 1) * per_page : number * per_page])
    paginator = Paginator(queryset, per_page)
    paginator.count = rows[0][1] if rows else 0  # a cached_property: set, never queried
    return Page([pk for pk, _ in rows], number, paginator)


def safe_next(request: HttpRequest, default: str) -> str:
    """The `next` a form carried, if it points into this site; else the default."""
    target = request.POST.get("next") or request.GET.get("next")
    if target and url_has_allowed_host_and_scheme(target, allowed_hosts={request.get_host()}, require_https=request.is_secure()):
        return target
    return default


def done(request: HttpRequest, *, partial: str, context: dict[str, Any], next_url: str) -> HttpResponse:
    """After a successful action: the partial for htmx, else post/redirect/get."""
    if request.htmx:
        return render(request, partial, {**context, "oob_messages": True})
    return HttpResponseRedirect(safe_next(request, next_url))


def domain_error(
    request: HttpRequest,
    exc: DomainError,
    *,
    partial: str | None,
    page: str,
    context: Any,
) -> HttpResponse:
    """A refused action: its message on the page and the error's status (409 for a conflict).

    `context` is a dict or a callable returning one, called after the refusal so
    the page shows the state the service left (the transaction rolled back).
    """
    messages.error(request, exc.detail)
    data = context() if callable(context) else context
    if request.htmx and partial:
        return render(request, partial, {**data, "oob_messages": True}, status=exc.status_code)
    return render(request, page, data, status=exc.status_code)
