from django.db.models import Exists, OuterRef, Q

from rentals.models import ACTIVE_RENDER_STATUSES, OPEN_RENTAL_STATUSES, Rental, RenderJob, RentalStatus


def node_is_rented(*, node_id: int) -> bool:
    """An open rental or an active render job holds the node (R3, R10)."""
    return (
        Rental.objects.filter(node_id=node_id, status__in=OPEN_RENTAL_STATUSES).exists()
        or RenderJob.objects.filter(node_id=node_id, status__in=ACTIVE_RENDER_STATUSES).exists()
    )


def rented_q(node_ref: str = "pk") -> Q:
    """For querysets of nodes: true where an open rental or an active render job holds it."""
    rental = Rental.objects.filter(node=OuterRef(node_ref), status__in=OPEN_RENTAL_STATUSES)
    render = RenderJob.objects.filter(node=OuterRef(node_ref), status__in=ACTIVE_RENDER_STATUSES)
    return Q(Exists(rental)) | Q(Exists(render))


def reclaim_has_pending_rentals(*, reclaim_id: int) -> bool:
    return Rental.objects.filter(reclaim_id=reclaim_id, status=RentalStatus.RECLAIMING).exists()


# --- Portal (dashboard) read side ----------------------------------------------

from django.db.models import Count, IntegerField, QuerySet, Subquery  # noqa: E402
from django.db.models.functions import Coalesce  # noqa: E402

from rentals.models import EndReason  # noqa: E402


def renter_rentals(*, renter) -> QuerySet[Rental]:
    """A renter's own rentals with their node, open ones first, newest first."""
    return Rental.objects.filter(renter=renter).select_related("node")


def open_rentals(*, renter) -> QuerySet[Rental]:
    return renter_rentals(renter=renter).filter(status__in=OPEN_RENTAL_STATUSES).order_by("-started_at", "-id")


def ended_rentals(*, renter) -> QuerySet[Rental]:
    return renter_rentals(renter=renter).filter(status=RentalStatus.ENDED).order_by("-ended_at", "-id")


def node_open_rental(*, node_id: int) -> Rental | None:
    return (
        Rental.objects.filter(node_id=node_id, status__in=OPEN_RENTAL_STATUSES).select_related("renter").first()
    )


def _count(queryset: QuerySet, ref: str) -> Subquery:
    """A correlated COUNT(*), so several counts over different relations never multiply."""
    counted = queryset.filter(**{ref: OuterRef("pk")}).order_by().values(ref).annotate(n=Count("pk")).values("n")
    return Coalesce(Subquery(counted, output_field=IntegerField()), 0)


def provider_rental_counts() -> QuerySet:
    """Every provider (a user with a node) with node and rental counts, for the staff page.

    `ended_by_provider` counts only on-demand rentals: spot rentals are left out
    of a provider's record (R11), and so they are here.
    """
    from django.contrib.auth import get_user_model

    from nodes.models import Node

    users = get_user_model().objects.filter(Exists(Node.objects.filter(provider=OuterRef("pk"))))
    return users.annotate(
        node_count=_count(Node.objects.all(), "provider"),
        rental_count=_count(Rental.objects.all(), "node__provider"),
        spot_rental_count=_count(Rental.objects.filter(is_spot=True), "node__provider"),
        ended_by_provider=_count(Rental.objects.filter(end_reason=EndReason.PROVIDER, is_spot=False), "node__provider"),
        open_rental_count=_count(Rental.objects.filter(status__in=OPEN_RENTAL_STATUSES), "node__provider"),
    ).order_by("-rental_count", "username")


def node_rental_counts() -> QuerySet:
    """Every node with its rental counts, most rented first, for the staff page."""
    from nodes.models import Node

    return Node.objects.select_related("provider").annotate(
        rental_count=_count(Rental.objects.all(), "node"),
        spot_rental_count=_count(Rental.objects.filter(is_spot=True), "node"),
        ended_by_provider=_count(Rental.objects.filter(end_reason=EndReason.PROVIDER, is_spot=False), "node"),
    ).order_by("-rental_count", "id")


def node_reclaims_later_than(*, node_id: int, at) -> bool:
    """A rental of the node is being reclaimed, at a time later than `at` (R12)."""
    return Rental.objects.filter(node_id=node_id, status=RentalStatus.RECLAIMING, reclaim_at__gt=at).exists()
