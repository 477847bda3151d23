"""The portal in real headless Chromium against a live server, Celery tasks running eagerly in-process."""

import re

import pytest
from playwright.sync_api import expect

from nodes.models import Node
from nodes.slots import acquire_slot, release_slot, router_heartbeat
from rentals.services import start_rental
from tests.browser.conftest import log_in
from tests.factories import ServedModelFactory, UserFactory, make_node, make_ready_worker

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def test_owner_pauses_a_busy_spot_node_and_watches_it_drain_without_reloading(live_server, browser_context, screenshot):
    owner = UserFactory(username="owner")
    node, _ = make_node(provider=owner, is_spot=True, name="spot-rig", cloud="aws", instance_type="g5.2xlarge", zone="us-east-1b")
    worker = make_ready_worker(node, model=ServedModelFactory())
    router_heartbeat(instance_id="browser-router")
    slot = acquire_slot(worker_id=worker.pk, router_instance="browser-router", request_id="req-browser-1")
    assert slot is not None

    page = log_in(browser_context, live_server, "owner")
    row = page.locator(f"#node-{node.pk}")
    expect(row).to_contain_text("Available")
    expect(row).to_contain_text("1/8")
    page.evaluate("window.__sameDocument = true")  # gone if the page ever reloads
    screenshot(page, "1-available")

    # Keyboard only: Pause shows what it will do, and the confirm button takes the focus.
    row.get_by_role("link", name="Pause…").focus()
    page.keyboard.press("Enter")
    expect(row).to_contain_text("1 request in flight will finish or be cut by")
    confirm = page.get_by_role("button", name="Pause now")
    expect(confirm).to_be_focused()
    screenshot(page, "2-confirm")
    page.keyboard.press("Enter")

    expect(row).to_contain_text("Draining")
    expect(row.locator(".in-flight")).to_have_text("1 request in flight")
    expect(row).to_contain_text(re.compile(r"stops in [0-2]:\d\d"))
    expect(row).to_have_attribute("hx-trigger", "every 1s")
    screenshot(page, "3-draining")

    # The request finishes: the slot's release stops the drained worker (finish_drain on commit).
    assert release_slot(slot_id=slot.pk, worker_id=worker.pk)
    expect(row).to_contain_text("Paused")
    expect(row.locator(".in-flight")).to_have_count(0)
    expect(row).not_to_have_attribute("hx-trigger", re.compile(".*"))  # nothing changes: polling stopped
    expect(row.get_by_role("button", name="Available")).to_be_visible()
    assert page.evaluate("window.__sameDocument") is True
    screenshot(page, "4-paused")
    assert not Node.objects.get(pk=node.pk).workload_enabled


def test_spot_toggle_of_a_rented_node_is_disabled_and_says_why(live_server, browser_context, screenshot):
    owner, renter = UserFactory(username="owner"), UserFactory(username="renter")
    node, _ = make_node(provider=owner, is_spot=True, name="rented-rig")
    free, _ = make_node(provider=owner, is_spot=True, name="free-rig")
    start_rental(renter=renter, node_id=node.pk)

    page = log_in(browser_context, live_server, "owner")
    toggle = page.locator(f"#spot-{node.pk}")
    expect(toggle).to_be_disabled()
    expect(toggle).to_have_accessible_description(re.compile("Locked while rented"))
    expect(page.locator(f"#spot-why-{node.pk}")).to_be_visible()
    expect(page.locator(f"#spot-{free.pk}")).to_be_enabled()
    screenshot(page, "1-locked")

    # A script posting the toggle anyway (a forged request) is refused by the server (R10).
    status = page.evaluate(
        """async (url) => {
            const token = JSON.parse(document.body.getAttribute("hx-headers"))["X-CSRFToken"];
            const response = await fetch(url, {method: "POST", body: new URLSearchParams({is_spot: "false"}),
                                               headers: {"X-CSRFToken": token, "HX-Request": "true"}});
            return response.status;
        }""",
        f"/nodes/{node.pk}/spot/",
    )
    assert status == 409
    # The same refusal through htmx swaps in the row and the message (a 409 is swapped, not dropped).
    page.evaluate(
        """(node) => htmx.ajax("POST", `/nodes/${node}/spot/`, {target: `#node-${node}`, swap: "outerHTML", values: {is_spot: "false"}})""",
        node.pk,
    )
    expect(page.locator("#messages")).to_contain_text("The spot flag cannot change while the node is rented.")
    expect(page.locator(f"#spot-{node.pk}")).to_be_disabled()
    screenshot(page, "2-refused")
    assert Node.objects.get(pk=node.pk).is_spot is True


def test_renter_sees_the_reclaim_banner_and_countdown_appear_after_the_owner_pauses(
    live_server, chromium, browser_context, screenshot
):
    owner, renter = UserFactory(username="owner"), UserFactory(username="renter")
    node, _ = make_node(provider=owner, is_spot=True, name="spot-rig")
    rental = start_rental(renter=renter, node_id=node.pk)

    renter_page = log_in(browser_context, live_server, "renter")
    renter_page.goto(f"{live_server.url}/rentals/")
    status = renter_page.locator(f"#rental-{rental.pk}-status")
    expect(status).to_contain_text("No reclaim is scheduled")
    renter_page.evaluate("window.__sameDocument = true")
    screenshot(renter_page, "1-renter-active")

    owner_context = chromium.new_context(viewport={"width": 1280, "height": 900}, timezone_id="UTC")
    try:
        owner_page = log_in(owner_context, live_server, "owner")
        row = owner_page.locator(f"#node-{node.pk}")
        row.get_by_role("link", name="Pause…").click()
        expect(row).to_contain_text("1 rental gets two minutes' notice")
        owner_page.get_by_role("button", name="Pause now").click()
        expect(row).to_contain_text("Paused")
        expect(row).to_contain_text(re.compile(r"Rental ends in [0-2]:\d\d"))
        screenshot(owner_page, "2-owner-paused")
    finally:
        owner_context.close()

    banner = status.locator(".banner.reclaim")
    expect(banner).to_be_visible()  # the status polls: no reload
    expect(banner).to_contain_text(re.compile(r"Reclaim at \d\d:\d\d:\d\d UTC"))
    countdown = banner.locator("time[data-countdown]")
    expect(countdown).to_have_text(re.compile(r"^[0-2]:\d\d$"))
    before = countdown.inner_text()
    expect(countdown).not_to_have_text(before, timeout=3_000)  # it ticks
    assert renter_page.evaluate("window.__sameDocument") is True
    notice = renter_page.evaluate("(url) => fetch(url).then(r => r.json())", f"/meta/{rental.notice_token}/latest/meta-data/spot/instance-action")
    assert notice["action"] == "terminate"
    screenshot(renter_page, "3-renter-banner")
