"""Open a page in a real headless Chromium over the DevTools protocol and report what a user would see.

Collects console errors and uncaught exceptions, evaluates checks in the page, and saves
a full-page screenshot. Uses aiohttp's websocket client (already a dependency).
"""

from __future__ import annotations

import asyncio
import base64
import itertools
import json
import os
import re
import shutil
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
    "--remote-debugging-address=127.0.0.1",
    "--remote-debugging-port=0",
]


def find_chromium() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        path = shutil.which(name)
        if path:
            return path
    return None


@dataclass
class PageVisit:
    """What happened when the page was opened."""

    console_errors: list[str] = field(default_factory=list)
    checks: dict[str, Any] = field(default_factory=dict)
    screenshot: Path | None = None


class _DevTools:
    """A minimal CDP session multiplexed over the browser websocket (flat sessions)."""

    def __init__(self, socket: aiohttp.ClientWebSocketResponse) -> None:
        self.socket = socket
        self.ids = itertools.count(1)
        self.pending: dict[int, asyncio.Future[Any]] = {}
        self.events: list[dict[str, Any]] = []
        self.reader = asyncio.create_task(self._read())

    async def _read(self) -> None:
        async for message in self.socket:
            data = json.loads(message.data)
            if "id" in data and data["id"] in self.pending:
                future = self.pending.pop(data["id"])
                if "error" in data:
                    future.set_exception(RuntimeError(str(data["error"])))
                else:
                    future.set_result(data.get("result", {}))
            elif "method" in data:
                self.events.append(data)

    async def send(self, method: str, params: dict[str, Any] | None = None, session: str | None = None) -> Any:
        message_id = next(self.ids)
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self.pending[message_id] = future
        payload: dict[str, Any] = {"id": message_id, "method": method, "params": params or {}}
        if session:
            payload["sessionId"] = session
        await self.socket.send_str(json.dumps(payload))
        return await asyncio.wait_for(future, 60)

    async def evaluate(self, expression: str, session: str) -> Any:
        result = await self.send("Runtime.evaluate", {"expression": expression, "returnByValue": True}, session)
        return result.get("result", {}).get("value")


def _console_errors(events: list[dict[str, Any]]) -> list[str]:
    errors: list[str] = []
    for event in events:
        params = event.get("params", {})
        if event["method"] == "Runtime.exceptionThrown":
            details = params.get("exceptionDetails", {})
            errors.append(str(details.get("exception", {}).get("description") or details.get("text")))
        elif event["method"] == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert"):
            errors.append(" ".join(str(arg.get("value", arg.get("description"))) for arg in params.get("args", [])))
        elif event["method"] == "Log.entryAdded" and params.get("entry", {}).get("level") == "error":
            errors.append(str(params["entry"].get("text")))
    return errors


async def _visit(
    ws_url: str, page_url: str, ready_js: str, checks_js: dict[str, str], screenshot: Path | None, timeout_s: float
) -> PageVisit:
    visit = PageVisit()
    async with aiohttp.ClientSession() as http, http.ws_connect(ws_url, max_msg_size=0) as socket:
        tools = _DevTools(socket)
        target = await tools.send("Target.createTarget", {"url": "about:blank"})
        attached = await tools.send("Target.attachToTarget", {"targetId": target["targetId"], "flatten": True})
        session = attached["sessionId"]
        for domain in ("Page.enable", "Runtime.enable", "Log.enable"):
            await tools.send(domain, session=session)
        await tools.send(
            "Emulation.setDeviceMetricsOverride",
            {"width": 1400, "height": 1000, "deviceScaleFactor": 1, "mobile": False},
            session,
        )
        await tools.send("Page.navigate", {"url": page_url}, session)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if await tools.evaluate(ready_js, session):
                break
            await asyncio.sleep(0.25)
        await asyncio.sleep(0.5)
        for name, expression in checks_js.items():
            visit.checks[name] = await tools.evaluate(expression, session)
        if screenshot is not None:
            metrics = await tools.send("Page.getLayoutMetrics", session=session)
            height = int(metrics.get("cssContentSize", metrics.get("contentSize", {})).get("height", 1000))
            shot = await tools.send(
                "Page.captureScreenshot",
                {
                    "format": "png",
                    "captureBeyondViewport": True,
                    "clip": {"x": 0, "y": 0, "width": 1400, "height": min(height, 12000), "scale": 1},
                },
                session,
            )
            screenshot.write_bytes(base64.b64decode(shot["data"]))
            visit.screenshot = screenshot
        visit.console_errors = _console_errors(tools.events)
        tools.reader.cancel()
    return visit


def visit_page(
    path: Path, *, ready_js: str, checks_js: dict[str, str], screenshot: Path | None = None, timeout_s: float = 60.0
) -> PageVisit:
    """Open file `path` in headless Chromium, wait for `ready_js` to be truthy, run the checks, screenshot."""
    chromium = find_chromium()
    assert chromium, "chromium is not installed"
    profile = tempfile.mkdtemp(prefix="vlmserve-chromium-")
    process = subprocess.Popen(
        [chromium, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", "about:blank"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        ws_url = None
        start = time.monotonic()
        assert process.stderr is not None
        while time.monotonic() - start < 60:
            line = process.stderr.readline()
            if not line and process.poll() is not None:
                break
            match = re.search(r"DevTools listening on (ws://\S+)", line)
            if match:
                ws_url = match.group(1)
                break
        assert ws_url, "chromium did not open its DevTools port"
        # keep draining stderr so a chatty browser never blocks on a full pipe
        threading.Thread(target=lambda: [None for _ in process.stderr], daemon=True).start()  # type: ignore[union-attr]
        return asyncio.run(_visit(ws_url, path.resolve().as_uri(), ready_js, checks_js, screenshot, timeout_s))
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, 9)
            process.wait(timeout=10)
        shutil.rmtree(profile, ignore_errors=True)


CHART_IDS = ("chart-throughput", "chart-ttft", "chart-tpot", "chart-pareto")


def check_report_in_browser(
    report: Path, screenshot: Path, chart_ids: tuple[str, ...] = CHART_IDS, title_mark: str | None = None
) -> dict[str, Any]:
    """Open a vlmserve HTML page as a user would: no console errors, every chart drawn, nothing fetched.

    Each of `chart_ids` must hold drawn traces; with `title_mark`, each chart's drawn title must
    contain it (the simulated mark). Returns the checks' values (traces per chart, titles).
    """
    checks = {
        chart: (
            f"(() => {{ const d = document.getElementById('{chart}'); if (!d) return -1;"
            " return d.querySelectorAll('svg.main-svg .scatterlayer .trace').length; })()"
        )
        for chart in chart_ids
    }
    titles = {
        f"title:{chart}": (
            f"(() => {{ const t = document.querySelector('#{chart} .gtitle'); return t ? t.textContent : null; }})()"
        )
        for chart in chart_ids
    }
    checks.update(titles)
    checks["external"] = (
        "Array.from(document.querySelectorAll('script[src],link[href]'))"
        ".map(e => e.src || e.href).filter(u => !u.startsWith('file:'))"
    )
    ready_js = (
        f"Array.from(document.querySelectorAll('.js-plotly-plot')).length >= {len(chart_ids)} && "
        "Array.from(document.querySelectorAll('.js-plotly-plot')).every(d => d.querySelector('svg.main-svg'))"
    )
    visit = visit_page(report, ready_js=ready_js, checks_js=checks, screenshot=screenshot)
    assert visit.console_errors == [], visit.console_errors
    for chart in chart_ids:
        assert visit.checks[chart] and visit.checks[chart] > 0, f"{chart} drew no traces: {visit.checks}"
        if title_mark is not None:
            assert title_mark in (visit.checks[f"title:{chart}"] or ""), f"{chart} title lacks {title_mark!r}"
    assert visit.checks["external"] == [], "the report must not load anything from the network"
    assert visit.screenshot is not None and visit.screenshot.stat().st_size > 10_000
    return visit.checks
