from rentals.models import OPEN_RENTAL_STATUSES, Rental, RentalStatus


def node_is_rented(*, node_id: int) -> bool:
    return Rental.objects.filter(node_id=node_id, status__in=OPEN_RENTAL_STATUSES).exists()


def reclaim_has_pending_rentals(*, reclaim_id: int) -> bool:
    return Rental.objects.filter(reclaim_id=reclaim_id, status=RentalStatus.RECLAIMING).exists()
