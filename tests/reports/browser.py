"""Drive Debian's headless Chromium over the Chrome DevTools Protocol, with the standard library.

Used by the browser test (console errors, network requests, which charts drew) and to take the
README's screenshot::

    python -m tests.reports.browser RUN/report.html docs/report.png

A minimal WebSocket client (RFC 6455: masked text frames out, fragmented frames in) is enough
for CDP on loopback; it keeps websocket and browser-automation packages out of the dependencies.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import socket
import struct
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

CHROMIUM_CANDIDATES = ("/usr/bin/chromium", "/usr/bin/chromium-browser")
CHROMIUM_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--hide-scrollbars",
    "--remote-debugging-port=0",
    "--remote-allow-origins=*",
)


def find_chromium() -> str | None:
    found = os.environ.get("ADVISOR_CHROMIUM") or shutil.which("chromium")
    if found:
        return found
    return next((p for p in CHROMIUM_CANDIDATES if Path(p).is_file()), None)


class WebSocket:
    """Just enough of RFC 6455 for one CDP connection on loopback."""

    def __init__(self, url: str, timeout_s: float = 30.0) -> None:
        assert url.startswith("ws://")
        host_port, _, path = url[len("ws://") :].partition("/")
        host, _, port = host_port.partition(":")
        self.sock = socket.create_connection((host, int(port)), timeout=timeout_s)
        key = base64.b64encode(os.urandom(16)).decode()
        request = (
            f"GET /{path} HTTP/1.1\r\nHost: {host_port}\r\nUpgrade: websocket\r\n"
            f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n"
        )
        self.sock.sendall(request.encode())
        response = b""
        while b"\r\n\r\n" not in response:
            chunk = self.sock.recv(4096)
            if not chunk:
                raise ConnectionError("the browser closed the WebSocket handshake")
            response += chunk
        head, _, self._buffer = response.partition(b"\r\n\r\n")
        if b" 101 " not in head.split(b"\r\n", 1)[0]:
            raise ConnectionError(f"WebSocket upgrade refused: {head[:200]!r}")

    def _read(self, n: int) -> bytes:
        while len(self._buffer) < n:
            chunk = self.sock.recv(max(65536, n - len(self._buffer)))
            if not chunk:
                raise ConnectionError("the browser closed the WebSocket")
            self._buffer += chunk
        out, self._buffer = self._buffer[:n], self._buffer[n:]
        return out

    def send(self, text: str) -> None:
        payload = text.encode()
        header = bytearray([0x81])  # FIN + text
        n = len(payload)
        if n < 126:
            header.append(0x80 | n)
        elif n < 2**16:
            header += bytes([0x80 | 126]) + struct.pack(">H", n)
        else:
            header += bytes([0x80 | 127]) + struct.pack(">Q", n)
        mask = os.urandom(4)
        masked = bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
        self.sock.sendall(bytes(header) + mask + masked)

    def recv(self) -> str:
        message = b""
        while True:
            b0, b1 = self._read(2)
            opcode, n = b0 & 0x0F, b1 & 0x7F
            if n == 126:
                (n,) = struct.unpack(">H", self._read(2))
            elif n == 127:
                (n,) = struct.unpack(">Q", self._read(8))
            mask = self._read(4) if b1 & 0x80 else b""
            payload = self._read(n)
            if mask:
                payload = bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
            if opcode == 0x8:
                raise ConnectionError("the browser closed the WebSocket")
            if opcode == 0x9:  # ping: answer so the browser keeps the connection
                self.sock.sendall(bytes([0x8A, 0x80 | len(payload)]) + b"\0\0\0\0" + payload)
                continue
            if opcode in (0x1, 0x0):
                message += payload
                if b0 & 0x80:
                    return message.decode()

    def close(self) -> None:
        self.sock.close()


class Page:
    """One page target: CDP commands, and the events that arrived meanwhile."""

    def __init__(self, ws: WebSocket) -> None:
        self.ws = ws
        self.events: list[dict[str, Any]] = []
        self._next_id = 0

    def call(self, method: str, **params: Any) -> dict[str, Any]:
        self._next_id += 1
        ident = self._next_id
        self.ws.send(json.dumps({"id": ident, "method": method, "params": params}))
        while True:
            message = json.loads(self.ws.recv())
            if message.get("id") == ident:
                if "error" in message:
                    raise RuntimeError(f"{method}: {message['error']}")
                return dict(message.get("result", {}))
            if "method" in message:
                self.events.append(message)

    def evaluate(self, expression: str) -> Any:
        result = self.call("Runtime.evaluate", expression=expression, returnByValue=True)
        if "exceptionDetails" in result:
            raise RuntimeError(f"{expression}: {result['exceptionDetails']}")
        return result["result"].get("value")

    def wait_for(self, expression: str, timeout_s: float = 30.0) -> Any:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            value = self.evaluate(expression)
            if value:
                return value
            time.sleep(0.1)
        raise TimeoutError(f"{expression} stayed false for {timeout_s} s")

    def console_errors(self) -> list[str]:
        """Console errors, uncaught exceptions and browser log errors (CSP, failed loads)."""
        out = []
        for e in self.events:
            method, params = e["method"], e.get("params", {})
            if method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert"):
                args = [
                    str(a.get("value", a.get("description", ""))) for a in params.get("args", [])
                ]
                out.append("console.error: " + " ".join(args))
            elif method == "Runtime.exceptionThrown":
                details = params.get("exceptionDetails", {})
                text = details.get("exception", {}).get("description") or details.get("text")
                out.append(f"exception: {text}")
            elif method == "Log.entryAdded" and params.get("entry", {}).get("level") == "error":
                entry = params["entry"]
                out.append(
                    f"log ({entry.get('source')}): {entry.get('text')} {entry.get('url', '')}"
                )
        return out

    def requests(self) -> list[str]:
        return [
            e["params"]["request"]["url"]
            for e in self.events
            if e["method"] == "Network.requestWillBeSent"
        ]


@contextmanager
def chromium_page(chromium: str, timeout_s: float = 60.0) -> Iterator[Page]:
    """A fresh headless Chromium (own profile directory) and its one blank page."""
    profile = tempfile.mkdtemp(prefix="advisor-chromium-")
    process = subprocess.Popen(
        [chromium, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", "about:blank"],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        endpoint = _devtools_endpoint(process, timeout_s)
        ws = WebSocket(_page_url(endpoint, timeout_s), timeout_s)
        try:
            page = Page(ws)
            for domain in ("Runtime", "Log", "Page", "Network"):
                page.call(f"{domain}.enable")
            yield page
        finally:
            ws.close()
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        _remove_profile(profile)


def _remove_profile(path: str) -> None:
    """Chromium's helper processes may still write to the profile for a moment after the
    browser exits: retry, then leave what is left to the OS's temporary-file cleanup."""
    for _ in range(20):
        try:
            shutil.rmtree(path)
            return
        except FileNotFoundError:
            return
        except OSError:
            time.sleep(0.1)
    shutil.rmtree(path, ignore_errors=True)


def _devtools_endpoint(process: subprocess.Popen[str], timeout_s: float) -> str:
    """host:port from Chromium's 'DevTools listening on ws://HOST:PORT/...' line."""
    assert process.stderr is not None
    deadline = time.monotonic() + timeout_s
    seen = []
    while time.monotonic() < deadline:
        line = process.stderr.readline()
        if not line:
            if process.poll() is not None:
                break
            continue
        seen.append(line)
        if "DevTools listening on ws://" in line:
            return line.split("ws://", 1)[1].split("/", 1)[0]
    raise RuntimeError("Chromium did not start its DevTools endpoint: " + "".join(seen[-5:]))


def _page_url(endpoint: str, timeout_s: float) -> str:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with urllib.request.urlopen(f"http://{endpoint}/json/list", timeout=timeout_s) as r:
            targets = json.loads(r.read())
        pages = [t for t in targets if t.get("type") == "page"]
        if pages:
            return str(pages[0]["webSocketDebuggerUrl"])
        time.sleep(0.1)
    raise RuntimeError("Chromium opened no page")


def open_report(page: Page, path: Path, width: int = 1360, height: int = 900) -> dict[str, Any]:
    """Load the report and wait for its script; what it drew, pixel by pixel."""
    page.call(
        "Emulation.setDeviceMetricsOverride",
        width=width,
        height=height,
        deviceScaleFactor=1,
        mobile=False,
    )
    page.call("Page.navigate", url=path.resolve().as_uri())
    page.wait_for(
        "document.readyState === 'complete' && window.advisorReport && window.advisorReport.done"
    )
    return dict(
        page.evaluate(
            """(() => {
              const canvases = Array.from(document.querySelectorAll('canvas'));
              const painted = {};
              for (const c of canvases) {
                const chart = window.Chart && window.Chart.getChart(c);
                const data = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
                let n = 0;
                for (let i = 3; i < data.length; i += 4) { if (data[i] !== 0) { n++; } }
                painted[c.id] = {chart: !!chart, pixels: n, width: c.width, height: c.height};
              }
              return {drawn: window.advisorReport.drawn, failed: window.advisorReport.failed,
                      painted: painted};
            })()"""
        )
    )


def screenshot(page: Page, out: Path, width: int = 1360, max_height: int = 7000) -> None:
    """The whole page (up to ``max_height`` CSS pixels) as a PNG."""
    metrics = page.call("Page.getLayoutMetrics")
    height = min(int(metrics["cssContentSize"]["height"]), max_height)
    page.call(
        "Emulation.setDeviceMetricsOverride",
        width=width,
        height=height,
        deviceScaleFactor=1,
        mobile=False,
    )
    page.evaluate("new Promise(r => requestAnimationFrame(() => requestAnimationFrame(r)))")
    shot = page.call(
        "Page.captureScreenshot",
        format="png",
        clip={"x": 0, "y": 0, "width": width, "height": height, "scale": 1},
        captureBeyondViewport=True,
    )
    out.write_bytes(base64.b64decode(shot["data"]))


def main(argv: list[str]) -> int:
    if len(argv) not in (2, 3):
        print(
            "usage: python -m tests.reports.browser REPORT.html OUT.png [MAX_HEIGHT]",
            file=sys.stderr,
        )
        return 2
    chromium = find_chromium()
    if chromium is None:
        print("chromium not found: apt-get install -y chromium", file=sys.stderr)
        return 1
    with chromium_page(chromium) as page:
        state = open_report(page, Path(argv[0]))
        screenshot(page, Path(argv[1]), max_height=int(argv[2]) if len(argv) == 3 else 7000)
        errors = page.console_errors()
    print(json.dumps({"drawn": state["drawn"], "failed": state["failed"], "errors": errors}))
    return 1 if errors or state["failed"] else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
