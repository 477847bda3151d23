"""Every page in Chromium at desktop and phone widths (screenshots), keyboard focus, and every action without JavaScript."""

import re
from datetime import timedelta

import pytest
import time_machine
from django.utils import timezone
from playwright.sync_api import expect

from inference.keys import create_api_key
from nodes.drain import finish_drain
from nodes.models import Node
from nodes.services import pause_node
from nodes.slots import acquire_slot, router_heartbeat
from rentals.models import Rental, RentalStatus
from rentals.services import end_rental, start_rental
from tests.browser.conftest import log_in
from tests.factories import ServedModelFactory, UserFactory, make_node, make_ready_worker

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

PHONE = {"width": 390, "height": 844}


def marketplace():
    """Owner, renter and staff, with nodes in every state and a reclaim history."""
    owner, renter = UserFactory(username="owner"), UserFactory(username="renter")
    UserFactory(username="staff", is_staff=True, is_superuser=True)
    model = ServedModelFactory()
    router_heartbeat(instance_id="tour-router")

    serving, _ = make_node(provider=owner, name="a100-serving", is_spot=True, cloud="aws", instance_type="p4d.24xlarge", zone="us-east-1a", gpu_count=8)
    worker = make_ready_worker(serving, model=model)
    for i in range(3):
        acquire_slot(worker_id=worker.pk, router_instance="tour-router", request_id=f"req-{i}")

    history, _ = make_node(provider=owner, name="h100-history", is_spot=True, gpu_model="H100", cloud="gcp", instance_type="a3-highgpu-8g", zone="us-central1-a")
    old = make_ready_worker(history, model=model)
    acquire_slot(worker_id=old.pk, router_instance="tour-router", request_id="req-cut")
    started = timezone.now() - timedelta(minutes=10)
    with time_machine.travel(started, tick=False):
        pause_node(node_id=history.pk)  # the eager deadline task finds the request still running
    with time_machine.travel(started + timedelta(seconds=120), tick=False):
        finish_drain(old.pk)  # the deadline: the request is cut

    rented, _ = make_node(provider=owner, name="l4-rented", is_spot=True, gpu_model="L4", vram_gb=24)
    rental = start_rental(renter=renter, node_id=rented.pk, hours=6)
    pause_node(node_id=rented.pk)
    make_node(provider=owner, name="rtx-offline", gpu_model="RTX 4090", online=False)
    make_node(provider=owner, name="on-demand-a100", is_spot=False, price_per_hour="2.40")

    other = UserFactory(username="provider2")
    done, _ = make_node(provider=other, name="ended-rig", is_spot=True, price_per_hour="0.70")
    end_rental(rental_id=start_rental(renter=renter, node_id=done.pk).pk, reason="renter")
    make_node(provider=other, name="cheap-l4", gpu_model="L4", is_spot=True, price_per_hour="0.45")
    create_api_key(user=renter, name="laptop")
    return {"serving": serving, "history": history, "rental": rental}


def check_page(page, screenshot, name: str) -> None:
    expect(page.locator("h1").first).to_be_visible()
    overflow = page.evaluate("document.documentElement.scrollWidth - window.innerWidth")
    assert overflow <= 0, f"{name} scrolls sideways by {overflow}px"
    screenshot(page, name)


def test_every_page_at_desktop_and_phone_width(live_server, chromium, browser_context, screenshot):
    data = marketplace()
    anonymous = browser_context.new_page()
    for path, name in (("/", "home"), ("/accounts/signup/", "signup"), ("/accounts/login/", "login")):
        anonymous.goto(live_server.url + path)
        check_page(anonymous, screenshot, f"desktop-{name}")

    owner = log_in(browser_context, live_server, "owner")
    pages = {
        "nodes": "/nodes/",
        "node-serving": f"/nodes/{data['serving'].pk}/",
        "node-history": f"/nodes/{data['history'].pk}/",
        "pause-confirm": f"/nodes/{data['serving'].pk}/pause/",
        "node-new": "/nodes/new/",
    }
    for name, path in pages.items():
        owner.goto(live_server.url + path)
        check_page(owner, screenshot, f"desktop-{name}")
    owner.fill("#id_name", "new-rig")
    owner.fill("#id_price_per_hour", "1.10")
    owner.get_by_role("button", name="Add node").click()
    expect(owner.locator("#agent-token")).to_be_visible()
    check_page(owner, screenshot, "desktop-node-created")

    renter_context = chromium.new_context(viewport={"width": 1280, "height": 900}, timezone_id="UTC")
    phone_context = chromium.new_context(viewport=PHONE, timezone_id="UTC", is_mobile=True, has_touch=True)
    staff_context = chromium.new_context(viewport={"width": 1280, "height": 900}, timezone_id="UTC")
    try:
        renter = log_in(renter_context, live_server, "renter")
        for name, path in (("offers", "/offers/"), ("rentals", "/rentals/"), ("rental", f"/rentals/{data['rental'].pk}/"), ("keys", "/keys/")):
            renter.goto(live_server.url + path)
            check_page(renter, screenshot, f"desktop-{name}")
        staff = log_in(staff_context, live_server, "staff")
        staff.goto(live_server.url + "/staff/")
        check_page(staff, screenshot, "desktop-staff")

        phone = log_in(phone_context, live_server, "owner")
        for name, path in (("nodes", "/nodes/"), ("node-history", f"/nodes/{data['history'].pk}/"), ("offers", "/offers/")):
            phone.goto(live_server.url + path)
            check_page(phone, screenshot, f"phone-{name}")
        phone.get_by_role("button", name="Log out").click()
        phone.wait_for_url(live_server.url + "/")
        renter_phone = log_in(phone_context, live_server, "renter")
        renter_phone.goto(live_server.url + "/rentals/")
        check_page(renter_phone, screenshot, "phone-rentals")
    finally:
        for context in (renter_context, phone_context, staff_context):
            context.close()


def test_keyboard_focus_is_always_visible(live_server, browser_context):
    marketplace()
    page = log_in(browser_context, live_server, "owner")
    page.keyboard.press("Tab")
    skip = page.get_by_role("link", name="Skip to content")
    expect(skip).to_be_focused()
    expect(skip).to_be_in_viewport()
    for _ in range(12):
        page.keyboard.press("Tab")
        outline = page.evaluate("getComputedStyle(document.activeElement).outlineStyle")
        tag = page.evaluate("document.activeElement.tagName")
        assert tag in ("A", "BUTTON", "INPUT", "SELECT") and outline == "solid", (tag, outline)


def test_every_action_works_without_javascript(live_server, chromium, screenshot):
    owner, renter = UserFactory(username="owner"), UserFactory(username="renter")
    node, _ = make_node(provider=owner, name="plain-rig", is_spot=True)
    context = chromium.new_context(java_script_enabled=False, viewport={"width": 1280, "height": 900}, timezone_id="UTC")
    try:
        page = log_in(context, live_server, "owner")
        row = page.locator(f"#node-{node.pk}")
        row.get_by_role("link", name="Pause…").click()  # the confirm page, then post and redirect
        expect(page.locator("h1")).to_have_text("Pause plain-rig")
        page.get_by_role("button", name="Pause now").click()
        page.wait_for_url(f"{live_server.url}/nodes/")
        expect(row).to_contain_text("Paused")
        row.get_by_role("button", name="Available").click()
        expect(row).to_contain_text("Available")
        row.get_by_role("button", name="Make on-demand").click()
        expect(row).to_contain_text("On-demand")
        assert Node.objects.get(pk=node.pk).is_spot is False

        page.get_by_role("button", name="Log out").click()
        page.wait_for_url(f"{live_server.url}/")
        renter_page = log_in(context, live_server, "renter")
        renter_page.goto(f"{live_server.url}/offers/")
        renter_page.fill(f"#hours-{node.pk}", "3")
        renter_page.locator(f"#rent-{node.pk}").click()
        expect(renter_page.locator(".messages")).to_contain_text("You rented plain-rig.")
        rental = Rental.objects.get(renter=renter)
        renter_page.get_by_role("button", name="End this rental").click()
        renter_page.wait_for_url(f"{live_server.url}/rentals/")
        expect(renter_page.locator("table")).to_contain_text("Ended by you")
        screenshot(renter_page, "renter-no-js")
        rental.refresh_from_db()
        assert rental.status == RentalStatus.ENDED and re.match(r"renter", rental.end_reason)
    finally:
        context.close()
