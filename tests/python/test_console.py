"""The task console (an MCP App, `ui://script-runner/console`) in a real browser:
headless Chromium from Debian, driven by Playwright, loads a test host page
(console_host.html) that implements the host side of the Apps bridge against
the real server, through a small proxy this test serves beside it. The page
starts a task as a host would; the test watches the tails grow in the app, its
kill button end a task, and the collected files and workspace versions list.

CONSOLE_SCREENSHOTS=<dir> keeps a screenshot of each test there (the dated ones
in docs/evidence/ were taken so)."""

from __future__ import annotations

import json
import os
import shutil
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import quote

import httpx2
import pytest
from conftest import Stack
from playwright.async_api import Page, async_playwright, expect
from test_mcp_sdk import b64

pytestmark = pytest.mark.anyio

HOST_PAGE = Path(__file__).with_name("console_host.html")
CONSOLE_MIME = "text/html;profile=mcp-app"


@pytest.fixture(scope="module")
def host(stack: Stack) -> Iterator[str]:
    """The host page's URL: this page, and /rpc, which sends a JSON-RPC request
    on to the api with the bearer token and returns its answer."""
    page = HOST_PAGE.read_bytes()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            self.answer(200, "text/html; charset=utf-8", page)

        def do_POST(self) -> None:  # noqa: N802
            body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
            r = httpx2.post(
                stack.mcp_url,
                content=body,
                headers={
                    "Authorization": f"Bearer {stack.token}",
                    "Content-Type": "application/json",
                    "Accept": "application/json, text/event-stream",
                    "MCP-Protocol-Version": "2025-11-25",
                },
                timeout=60,
            )
            # The console's calls carry no progressToken, so the answer is
            # JSON; an SSE one would be a fault here, shown as such.
            kind = r.headers.get("content-type", "")
            if not kind.startswith("application/json"):
                fault = {"jsonrpc": "2.0", "id": None, "error": {"code": -32603, "message": f"not JSON: {kind}"}}
                self.answer(502, "application/json", json.dumps(fault).encode())
                return
            self.answer(r.status_code, kind, r.content)

        def answer(self, status: int, kind: str, body: bytes) -> None:
            self.send_response(status)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()


def chromium() -> str:
    path = shutil.which("chromium")
    if path is None:
        pytest.fail("chromium must be installed (scripts/test.sh installs Debian's)", pytrace=False)
    return path


async def open_console(page: Page, host: str, args: dict[str, object], theme: str) -> None:
    url = f"{host}?tool=run_script&theme={theme}&args={quote(json.dumps(args))}"
    await page.goto(url)


async def screenshot(page: Page, name: str) -> None:
    where = os.environ.get("CONSOLE_SCREENSHOTS")
    if where:
        Path(where).mkdir(parents=True, exist_ok=True)
        await page.locator("#app").screenshot(path=str(Path(where) / f"{name}.png"))


async def test_the_console_follows_a_task_as_its_tails_grow_and_lists_its_files(host: str) -> None:
    lines = "for i in $(seq 1 8); do echo line $i; sleep 0.5; done; mkdir -p out; echo done > out/report.txt"
    args = {"runtime": "python3.13", "command_base64": b64(lines), "collect": ["out/*"], "workspace": "new"}
    async with async_playwright() as p:
        browser = await p.chromium.launch(executable_path=chromium(), args=["--no-sandbox"])
        page = await browser.new_page(viewport={"width": 800, "height": 620})
        problems: list[str] = []
        page.on("console", lambda m: problems.append(m.text) if m.type == "error" else None)
        await open_console(page, host, args, "light")
        app = page.frame_locator("#app")
        stdout = app.locator("#stdout")
        await expect(stdout).to_contain_text("line 2", timeout=60_000)
        early = await stdout.inner_text()
        # The tails grow in the page while the task runs.
        await expect(stdout).to_contain_text("line 6", timeout=30_000)
        assert len(await stdout.inner_text()) > len(early)
        await expect(app.locator("#state")).to_have_text("succeeded", timeout=60_000)
        await expect(app.locator("#files")).to_contain_text("out/report.txt", timeout=30_000)
        # The workspace the task made, with the version it saved.
        await expect(app.locator("#versions")).to_contain_text("1", timeout=30_000)
        task_id = await app.locator("#task-id").inner_text()
        await expect(app.locator("#versions")).to_contain_text(task_id)
        await expect(app.locator("#kill")).to_be_disabled()
        mime = await page.evaluate("window.hostLog.mimeType")
        assert mime == CONSOLE_MIME
        await screenshot(page, "console-succeeded-light")
        # The app ran under the default CSP with nothing refused.
        assert not [m for m in problems if "Content Security Policy" in m], problems
        await browser.close()


async def test_the_kill_button_ends_a_running_task_from_the_keyboard(host: str) -> None:
    args = {"runtime": "python3.13", "command_base64": b64("echo started; sleep 120")}
    async with async_playwright() as p:
        browser = await p.chromium.launch(executable_path=chromium(), args=["--no-sandbox"])
        page = await browser.new_page(viewport={"width": 800, "height": 620})
        await open_console(page, host, args, "dark")
        app = page.frame_locator("#app")
        await expect(app.locator("#stdout")).to_contain_text("started", timeout=60_000)
        await expect(app.locator("#state")).to_have_text("running")
        kill = app.locator("#kill")
        await kill.focus()
        await page.keyboard.press("Enter")
        await expect(app.locator("#state")).to_have_text("killed", timeout=30_000)
        await expect(app.locator("#reason")).to_contain_text("kill_task")
        await expect(app.locator("#files")).to_contain_text("no files collected", timeout=30_000)
        # The dark theme the host asked for, taken by the app.
        assert await app.locator("html").get_attribute("data-theme") == "dark"
        # The host saw the app's own kill_task go through the bridge.
        calls = await page.evaluate("window.hostLog.fromApp.filter(m => m.method === 'tools/call').map(m => m.params.name)")
        assert "kill_task" in calls and "get_task_status" in calls, calls
        await screenshot(page, "console-killed-dark")
        await browser.close()
