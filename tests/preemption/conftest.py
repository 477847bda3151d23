import pytest
from rest_framework.test import APIClient


@pytest.fixture
def webhook():
    """A cloud's relay: no user, no token; only the signature speaks for it."""
    return APIClient()


@pytest.fixture
def prod(settings):
    settings.PREEMPTION_MODE = "prod"


@pytest.fixture
def shadow(settings):
    settings.PREEMPTION_MODE = "shadow"


@pytest.fixture
def off(settings):
    settings.PREEMPTION_MODE = "off"


@pytest.fixture(autouse=True)
def _at_t0():
    """Every test starts at T0 (the fixtures' times), the clock still; tests travel on from there."""
    import time_machine

    from tests.preemption.docs import T0

    with time_machine.travel(T0, tick=False):
        yield
