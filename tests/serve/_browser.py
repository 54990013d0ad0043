"""Fixtures of the web console's browser tests (helpers: :mod:`tests.serve.browsing`).

Test modules load them with ``pytest_plugins = ["tests.serve._browser"]``.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from playwright.sync_api import Browser, ConsoleMessage, Playwright, Request, sync_playwright

from tests.serve.browsing import CHROMIUM, CHROMIUM_ARGS, ConsolePage, ServeProcess, start_serve

__all__ = ["chromium_browser", "console", "console_server"]


@pytest.fixture(scope="module")
def console_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServeProcess]:
    """One server without a token for a test module, on an embedded log of its own."""
    logdir = tmp_path_factory.mktemp("console-log")
    server = start_serve(logdir)
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def chromium_browser() -> Iterator[Browser]:
    """Debian's chromium, headless, for a test module (Playwright's driver and its event loop
    live no longer than the module's tests). Fails (never skips) without it."""
    if not CHROMIUM.exists():
        pytest.fail(
            f"{CHROMIUM} is missing: the console is tested in Debian's chromium. Install it "
            "with `apt-get install chromium` (scripts/test does so when run as root)."
        )
    with sync_playwright() as playwright:
        yield _launch(playwright)


def _launch(playwright: Playwright) -> Browser:
    try:
        return playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
    except Exception as exc:
        pytest.fail(f"{CHROMIUM} did not start under Playwright: {exc}")


@pytest.fixture
def console(chromium_browser: Browser) -> Iterator[ConsolePage]:
    """A new browser context and page, 1100x800, closed after the test."""
    context = chromium_browser.new_context(
        viewport={"width": 1100, "height": 800}, color_scheme="light"
    )
    context.set_default_timeout(10_000)
    page = context.new_page()
    tab = ConsolePage(page)

    def on_console(message: ConsoleMessage) -> None:
        # A refused request is the browser's own log line for an answer the console handles
        # (the 401 that asks for a token); anything else the page logs as an error is not.
        if message.type == "error" and "the server responded with a status of" not in message.text:
            tab.errors.append(message.text)

    def on_request(request: Request) -> None:
        tab.requests.append(request.url)

    page.on("pageerror", lambda exc: tab.errors.append(f"uncaught: {exc}"))
    page.on("console", on_console)
    page.on("request", on_request)
    try:
        yield tab
    finally:
        context.close()
