from django.db.models import Count, F, OuterRef, Q, QuerySet, Subquery

from reputation.models import NodeReputation, ProviderReputation, Standing


def node_reliability_subquery() -> Subquery:
    """A node's score, or NULL while none of its rentals is counted (offers' `reliability`)."""
    counted = NodeReputation.objects.filter(node=OuterRef("pk")).annotate(n=F("successes") + F("failures")).filter(n__gt=0)
    return Subquery(counted.values("score")[:1])


def delisted_provider_ids() -> QuerySet:
    return ProviderReputation.objects.filter(standing=Standing.DELISTED).values("provider_id")


def provider_scores() -> QuerySet[ProviderReputation]:
    return ProviderReputation.objects.select_related("provider").annotate(
        node_count=Count("provider__nodes", distinct=True)
    ).order_by("score")
