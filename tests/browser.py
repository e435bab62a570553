"""Headless Chromium (Debian's ``chromium`` package, which ``.ci/run`` installs; no browser is
downloaded) driven over the Chrome DevTools Protocol, for the tests of ``report.html``.

:class:`Browser` starts ``chromium --headless`` with a DevTools port, opens one page, records
what the page did (every network request, console message, uncaught exception and log entry)
and evaluates JavaScript in it. The protocol client is a few lines over ``websocket-client``.

Example:
    with Browser() as browser:
        browser.open(path)
        browser.evaluate("document.title")
"""

from __future__ import annotations

import base64
import json
import os
import re
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

#: Names of Debian's (and other distributions') Chromium.
CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome")


def find_chromium() -> str | None:
    for name in CHROMIUM_NAMES:
        path = shutil.which(name)
        if path:
            return path
    return None


class Browser:
    """One headless Chromium with one page; ``events`` holds the page's protocol events."""

    def __init__(self, width: int = 1400, height: int = 1000, timeout_s: float = 30) -> None:
        self.width, self.height, self.timeout_s = width, height, timeout_s
        self.events: list[dict[str, Any]] = []
        self._id = 0

    # -- lifecycle ---------------------------------------------------------------------------
    def __enter__(self) -> Browser:
        import websocket

        binary = find_chromium()
        if binary is None:
            raise FileNotFoundError("no chromium on PATH")
        self._profile = tempfile.mkdtemp(prefix="raysearch-chromium-")
        self._proc = subprocess.Popen(
            [
                binary,
                "--headless",
                "--disable-gpu",
                "--no-sandbox",
                "--no-first-run",
                "--no-default-browser-check",
                "--disable-extensions",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                "--metrics-recording-only",
                "--remote-debugging-port=0",
                f"--user-data-dir={self._profile}",
                "about:blank",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        url = self._devtools_url()
        self._ws = websocket.create_connection(url, timeout=self.timeout_s, suppress_origin=True)
        target = self.send("Target.createTarget", {"url": "about:blank"})["targetId"]
        self._session = self.send("Target.attachToTarget", {"targetId": target, "flatten": True})[
            "sessionId"
        ]
        for domain in ("Page", "Runtime", "Network", "Log"):
            self.send(f"{domain}.enable", session=True)
        self.send(
            "Emulation.setDeviceMetricsOverride",
            {"width": self.width, "height": self.height, "deviceScaleFactor": 1, "mobile": False},
            session=True,
        )
        return self

    def __exit__(self, *exc: Any) -> None:
        try:
            self._ws.close()
        finally:
            self._proc.terminate()
            try:
                self._proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
            shutil.rmtree(self._profile, ignore_errors=True)

    def _devtools_url(self) -> str:
        """The browser's DevTools websocket, from the line Chromium prints on stderr."""
        deadline = time.monotonic() + self.timeout_s
        seen = []
        assert self._proc.stderr is not None
        while time.monotonic() < deadline:
            line = self._proc.stderr.readline()
            if not line and self._proc.poll() is not None:
                break
            seen.append(line)
            found = re.search(r"DevTools listening on (ws://\S+)", line)
            if found:
                return found.group(1)
        raise RuntimeError(f"chromium did not start: {''.join(seen)[-2000:]}")

    # -- the protocol ------------------------------------------------------------------------
    def send(self, method: str, params: dict[str, Any] | None = None, session: bool = False):
        """Send one command and return its result; events that arrive meanwhile are kept."""
        self._id += 1
        message: dict[str, Any] = {"id": self._id, "method": method, "params": params or {}}
        if session:
            message["sessionId"] = self._session
        self._ws.send(json.dumps(message))
        deadline = time.monotonic() + self.timeout_s
        while time.monotonic() < deadline:
            reply = json.loads(self._ws.recv())
            if reply.get("id") == self._id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply.get("result", {})
            if "method" in reply:
                self.events.append(reply)
        raise TimeoutError(method)

    def wait_for(self, method: str) -> dict[str, Any]:
        """The first event ``method`` (kept or still to come)."""
        deadline = time.monotonic() + self.timeout_s
        while time.monotonic() < deadline:
            for event in self.events:
                if event["method"] == method:
                    return event
            self.events.append(json.loads(self._ws.recv()))
        raise TimeoutError(method)

    # -- what the tests use ------------------------------------------------------------------
    def open(self, path: Path) -> None:
        """Load ``path`` and wait for its load event."""
        self.send("Page.navigate", {"url": Path(path).resolve().as_uri()}, session=True)
        self.wait_for("Page.loadEventFired")

    def evaluate(self, expression: str, await_promise: bool = False) -> Any:
        """The value of a JavaScript expression in the page (JSON-serialisable)."""
        result = self.send(
            "Runtime.evaluate",
            {"expression": expression, "returnByValue": True, "awaitPromise": await_promise},
            session=True,
        )
        if "exceptionDetails" in result:
            raise RuntimeError(f"{expression[:80]}: {result['exceptionDetails']}")
        return result["result"].get("value")

    def screenshot(self, path: Path) -> bytes:
        data = base64.b64decode(
            self.send("Page.captureScreenshot", {"format": "png"}, session=True)["data"]
        )
        Path(path).write_bytes(data)
        return data

    def requests(self) -> list[str]:
        """The URLs the page requested."""
        return [
            e["params"]["request"]["url"]
            for e in self.events
            if e["method"] == "Network.requestWillBeSent"
        ]

    def errors(self) -> list[str]:
        """Console errors and warnings, uncaught exceptions and error log entries."""
        out = []
        for e in self.events:
            params = e.get("params", {})
            if e["method"] == "Runtime.exceptionThrown":
                out.append(json.dumps(params["exceptionDetails"])[:500])
            elif e["method"] == "Runtime.consoleAPICalled" and params["type"] in (
                "error",
                "assert",
                "warning",
            ):
                out.append(json.dumps(params["args"])[:500])
            elif e["method"] == "Log.entryAdded" and params["entry"]["level"] == "error":
                out.append(params["entry"].get("text", "")[:500])
        return out


def chromium_required() -> bool:
    """In CI (``CI`` set) a missing Chromium is a failure, elsewhere a skip."""
    return os.environ.get("CI", "").lower() not in ("", "0", "false")
