"""How a rental's end counts, and the smoothed score. Pure: no database here.

Score = (successes + a) / (counted + a + b): a Beta(a, b) prior on the success
rate, so a new provider starts at a / (a + b) and one early failure moves the
score a little, not to zero. Spot rentals (is_spot frozen at their start) are
left out of both counts whatever their end: ending them is the point of spot.
"""

from django.conf import settings

SUCCESS_REASONS = ("renter", "term")
FAILURE_REASONS = ("provider", "node_lost")


def outcome(*, is_spot: bool, end_reason: str) -> str | None:
    """'success', 'failure', or None when the rental is not counted."""
    if is_spot:
        return None
    if end_reason in SUCCESS_REASONS:
        return "success"
    if end_reason in FAILURE_REASONS:
        return "failure"
    return None


def smoothed(successes: int, failures: int) -> float:
    a, b = settings.REPUTATION_PRIOR_SUCCESSES, settings.REPUTATION_PRIOR_FAILURES
    return (successes + a) / (successes + failures + a + b)
