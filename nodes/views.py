"""Provider pages: My nodes, a node's detail and reclaim timeline, Pause / Available, spot toggle, Add a node.

Each action calls the service the API calls (nodes.services); a refusal
(NotSpot, NodeRented, ...) is a message and a 409, never a 500 (R10: the
server refuses a spot toggle on a rented node whatever the page showed).
"""

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse, HttpResponseBadRequest
from django.shortcuts import get_object_or_404, render
from django.template.defaultfilters import pluralize
from django.urls import reverse
from django.utils import timezone
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from marketplace.errors import DomainError
from marketplace.portal import domain_error, done, paginate, safe_next
from marketplace.templatetags.portal import clock
from nodes import services
from nodes.forms import NodeCreateForm
from nodes.models import Node
from nodes.selectors import (
    in_flight_series,
    node_reclaims,
    node_summary,
    node_workers,
    pause_preview,
    portal_nodes,
)

RECLAIMS_PER_PAGE = 20


def own_node(request: HttpRequest, node_id: int) -> Node:
    # Another provider's node answers exactly like a missing one (R14).
    return get_object_or_404(portal_nodes(provider=request.user), pk=node_id)


def row_context(request: HttpRequest, node_id: int) -> dict:
    return {"row": node_summary(own_node(request, node_id))}


@login_required
@require_GET
def node_list(request: HttpRequest) -> HttpResponse:
    now = timezone.now()
    page = paginate(request, portal_nodes(provider=request.user))
    rows = [node_summary(node, now) for node in page]
    return render(request, "nodes/list.html", {"page": page, "rows": rows})


@login_required
@require_GET
def node_row(request: HttpRequest, node_id: int) -> HttpResponse:
    """One row of My nodes: what the row polls while its node is changing.

    The poll sends the fingerprint of the row it shows; an unchanged row is a
    204 and htmx swaps nothing, so focus and screen readers are left alone.
    """
    context = row_context(request, node_id)
    if request.htmx and request.GET.get("seen") == context["row"].fingerprint:
        return HttpResponse(status=204)
    return render(request, "nodes/_node_row.html", context)


def live_context(request: HttpRequest, node_id: int) -> dict:
    from rentals.selectors import node_open_rental

    node = own_node(request, node_id)
    workers = node_workers(node=node)
    return {
        "row": node_summary(node),
        "node": node,
        "workers": workers,
        "slots": [(worker, slot) for worker in workers for slot in worker.slot_list],
        "rental": node_open_rental(node_id=node.pk),
    }


def detail_context(request: HttpRequest, node_id: int) -> dict:
    context = live_context(request, node_id)
    page = paginate(request, node_reclaims(node=context["node"]), per_page=RECLAIMS_PER_PAGE)
    reclaims = list(page)
    return {**context, "page": page, "reclaims": reclaims, "series": in_flight_series(reclaims)}


@login_required
@require_GET
def node_detail(request: HttpRequest, node_id: int) -> HttpResponse:
    # While the node changes the page body polls itself (state, workers, slots
    # and the running reclaim's timeline); htmx gets only that part.
    template = "nodes/_node_live.html" if request.htmx else "nodes/detail.html"
    return render(request, template, detail_context(request, node_id))


def refused(request: HttpRequest, node_id: int, exc: DomainError) -> HttpResponse:
    return domain_error(
        request, exc, partial="nodes/_node_row.html", page="nodes/detail.html",
        context=lambda: row_context(request, node_id) if request.htmx else detail_context(request, node_id),
    )


def finished(request: HttpRequest, node_id: int) -> HttpResponse:
    return done(request, partial="nodes/_node_row.html", context=row_context(request, node_id), next_url=reverse("node-list"))


@login_required
@require_http_methods(["GET", "POST"])
def node_pause(request: HttpRequest, node_id: int) -> HttpResponse:
    """GET: what Pause will do, to confirm. POST: pause (spot nodes only, R2)."""
    node = own_node(request, node_id)
    if request.method == "GET":
        context = {
            "row": node_summary(node), "node": node, "preview": pause_preview(node=node),
            "next": safe_next(request, ""),
        }
        template = "nodes/_pause_confirm_row.html" if request.htmx else "nodes/pause_confirm.html"
        return render(request, template, context)
    try:
        _, reclaim = services.pause_node(node_id=node.pk)
    except DomainError as exc:
        return refused(request, node.pk, exc)
    if reclaim is not None and reclaim.finished_at is None:
        n = reclaim.in_flight_at_start
        messages.success(
            request,
            f"{node.name} is draining: {n} request{pluralize(n)} in flight finish{pluralize(n, 'es,')} or "
            f"{'is' if n == 1 else 'are'} cut by {clock(reclaim.deadline)}.",
        )
    else:
        messages.success(request, f"{node.name} is paused.")
    return finished(request, node.pk)


@login_required
@require_POST
def node_resume(request: HttpRequest, node_id: int) -> HttpResponse:
    """Available: workload on again (R2); a drain already begun still ends first."""
    node = own_node(request, node_id)
    try:
        services.resume_node(node_id=node.pk)
    except DomainError as exc:
        return refused(request, node.pk, exc)
    messages.success(request, f"{node.name} is available again.")
    return finished(request, node.pk)


@login_required
@require_POST
def node_spot(request: HttpRequest, node_id: int) -> HttpResponse:
    """The spot toggle; set_spot refuses under a rental with the node locked (R10)."""
    node = own_node(request, node_id)
    value = request.POST.get("is_spot")
    if value not in ("true", "false"):
        return HttpResponseBadRequest("is_spot must be true or false.")
    try:
        node = services.set_spot(node_id=node.pk, is_spot=value == "true")
    except DomainError as exc:
        return refused(request, node.pk, exc)
    messages.success(request, f"{node.name} is now {'spot' if node.is_spot else 'on-demand'}.")
    return finished(request, node.pk)


@login_required
@never_cache
@require_http_methods(["GET", "POST"])
def node_create(request: HttpRequest) -> HttpResponse:
    """Add a node. The agent token is shown once, in this response, and stored only as a hash."""
    form = NodeCreateForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        node, token = services.create_node(provider=request.user, **form.node_fields())
        server = request.build_absolute_uri("/").rstrip("/")
        return render(request, "nodes/created.html", {"node": node, "token": token, "server": server}, status=201)
    return render(request, "nodes/create.html", {"form": form}, status=400 if form.is_bound else 200)
