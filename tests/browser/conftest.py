"""Browser tests: Playwright's Python package driving Debian's /usr/bin/chromium headless.

No browser is downloaded (`playwright install` is never run). The pages are
served by pytest-django's live server (a thread of this process) with Celery
in eager mode, so the tasks a request enqueues on commit run in-process, as a
worker would run them. Without /usr/bin/chromium the tests are skipped, and
listed in the summary; in CI (CI=true) they fail instead.

Each test saves screenshots under artifacts/screenshots/, named in the summary.
"""

import os
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

CHROMIUM = Path(os.environ.get("CHROMIUM_PATH", "/usr/bin/chromium"))
CHROMIUM_ARGS = [
    "--no-sandbox", "--disable-gpu", "--disable-background-networking",
    "--disable-component-update", "--disable-sync", "--no-first-run",
]
SCREENSHOTS = Path(__file__).resolve().parents[2] / "artifacts" / "screenshots"
NOT_RUN: list[str] = []
SAVED: list[Path] = []


def _missing() -> str | None:
    if not CHROMIUM.exists():
        return f"{CHROMIUM} is missing (apt-get install chromium)"
    try:
        import playwright  # noqa: F401
    except ImportError:
        return "the playwright package is missing (pip install -e '.[test]')"
    return None


def pytest_configure(config):
    config.addinivalue_line("markers", "browser: drives headless Chromium against a live server")


def pytest_collection_modifyitems(config, items):
    browser_items = [item for item in items if "browser" in item.keywords]
    missing = _missing()
    if not browser_items or missing is None:
        return
    if os.environ.get("CI"):
        return  # CI runs them, and the chromium fixture fails them with the reason
    skip = pytest.mark.skip(reason=f"browser test not run: {missing}")
    for item in browser_items:
        item.add_marker(skip)
        NOT_RUN.append(item.nodeid)


def pytest_terminal_summary(terminalreporter):
    if NOT_RUN:
        terminalreporter.write_sep("!", f"browser tests NOT RUN ({_missing()})", red=True, bold=True)
        for nodeid in NOT_RUN:
            terminalreporter.write_line(f"  not run: {nodeid}", red=True)
    if SAVED:
        terminalreporter.write_sep("-", f"browser screenshots: {len(SAVED)} saved under {SCREENSHOTS}")


@pytest.fixture
def chromium() -> Iterator:
    """Chromium for one test.

    Per test, not per session: while Playwright's sync API runs, its asyncio
    loop counts as running on this thread, and Django refuses ORM calls from
    there unless told otherwise. The test's own ORM calls (set-up, releasing a
    slot) are plain sync code, so they are allowed here; once the browser is
    closed the loop is gone and the database teardown runs as usual.
    """
    missing = _missing()
    if missing:
        pytest.fail(f"CI must run the browser tests, but {missing}; .ci/run installs Debian's chromium.")
    from playwright.sync_api import sync_playwright

    previous = os.environ.get("DJANGO_ALLOW_ASYNC_UNSAFE")
    os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"
    try:
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=str(CHROMIUM), headless=True, args=CHROMIUM_ARGS)
            yield browser
            browser.close()
    finally:
        if previous is None:
            os.environ.pop("DJANGO_ALLOW_ASYNC_UNSAFE", None)
        else:
            os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = previous


@pytest.fixture
def browser_context(chromium):
    """A fresh context (cookies, storage) per test; a desktop-sized window."""
    context = chromium.new_context(viewport={"width": 1280, "height": 900}, locale="en-US", timezone_id="UTC")
    context.set_default_timeout(10_000)
    yield context
    context.close()


@pytest.fixture
def screenshot(request):
    """screenshot(page, "step") saves artifacts/screenshots/<test>-<step>.png."""
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    test = re.sub(r"[^A-Za-z0-9_.-]+", "_", request.node.name)

    def take(page, step: str) -> Path:
        path = SCREENSHOTS / f"{test}-{step}.png"
        page.screenshot(path=str(path), full_page=True)
        SAVED.append(path)
        return path

    return take


def log_in(context, live_server, username: str, password: str = "pw-correct-horse"):
    """Log in through the real form, as a person would; returns the page, on My nodes."""
    page = context.new_page()
    page.goto(f"{live_server.url}/accounts/login/")
    page.fill("#id_username", username)
    page.fill("#id_password", password)
    page.click("button[type=submit]")
    page.wait_for_url(f"{live_server.url}/nodes/")
    return page
