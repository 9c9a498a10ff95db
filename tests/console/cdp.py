"""Debian's chromium, headless, driven over the DevTools protocol on a pipe (no websocket library).

`chromium --remote-debugging-pipe` reads commands from its fd 3 and writes answers and events to
its fd 4, each a JSON object ended by a NUL byte. bash puts our two pipe ends on those numbers.
One page (a target attached in flat mode) is enough for the console's test.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
import shutil
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

__all__ = ["Page", "chromium_path", "open_page"]


def chromium_path() -> str | None:
    """Debian's chromium, if installed."""
    return shutil.which("chromium")


class Page:
    """One browser tab: navigate, evaluate, wait for a condition, screenshot."""

    def __init__(self, write_fd: int, reader: asyncio.StreamReader) -> None:
        self._write_fd = write_fd
        self._reader = reader
        self._ids = 0
        self._pending: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self.session: str | None = None
        self._task = asyncio.create_task(self._read())

    async def _read(self) -> None:
        while True:
            try:
                raw = await self._reader.readuntil(b"\0")
            except (asyncio.IncompleteReadError, asyncio.LimitOverrunError) as exc:
                for future in self._pending.values():
                    if not future.done():
                        future.set_exception(RuntimeError(f"chromium's pipe ended: {exc}"))
                return
            message: dict[str, Any] = json.loads(raw[:-1])
            waiter = self._pending.pop(message.get("id", -1), None)  # events have no id
            if waiter is not None and not waiter.done():
                waiter.set_result(message)

    async def call(
        self, method: str, params: dict[str, Any] | None = None, *, top: bool = False
    ) -> dict[str, Any]:
        """One DevTools command (to the page's session unless `top`); its result."""
        self._ids += 1
        message: dict[str, Any] = {"id": self._ids, "method": method, "params": params or {}}
        if self.session is not None and not top:
            message["sessionId"] = self.session
        future: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._pending[self._ids] = future
        os.write(self._write_fd, json.dumps(message).encode() + b"\0")
        answer = await asyncio.wait_for(future, 30)
        if "error" in answer:
            raise RuntimeError(f"{method}: {answer['error']}")
        result: dict[str, Any] = answer.get("result", {})
        return result

    async def evaluate(self, expression: str) -> Any:
        """The value of a JavaScript expression in the page (promises awaited)."""
        result = await self.call(
            "Runtime.evaluate",
            {"expression": expression, "returnByValue": True, "awaitPromise": True},
        )
        if "exceptionDetails" in result:
            raise RuntimeError(f"{expression}: {result['exceptionDetails']}")
        return result["result"].get("value")

    async def wait_for(self, expression: str, timeout: float = 20.0) -> Any:
        """Poll `expression` until truthy; its value. Fails naming it after `timeout`."""
        deadline = time.monotonic() + timeout
        while True:
            value = await self.evaluate(expression)
            if value:
                return value
            if time.monotonic() > deadline:
                raise AssertionError(f"not true within {timeout} s: {expression}")
            await asyncio.sleep(0.1)

    async def goto(self, url: str) -> None:
        """Open `url` and wait until the console drew it (body[data-loaded])."""
        await self.call("Page.navigate", {"url": url})
        await self.wait_for(
            f"location.href === {json.dumps(url)} && !!document.body && "
            "!!document.body.dataset.loaded"
        )

    async def screenshot(self, path: Path) -> None:
        """Save the page as a PNG."""
        shot = await self.call("Page.captureScreenshot", {"format": "png"})
        await asyncio.to_thread(path.write_bytes, base64.b64decode(shot["data"]))

    async def close(self) -> None:
        """Stop reading."""
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task


@contextlib.asynccontextmanager
async def open_page(profile: Path, width: int = 1280, height: int = 900) -> AsyncIterator[Page]:
    """Start chromium headless (its profile in `profile`) with one blank page; stop it by PID."""
    binary = chromium_path()
    assert binary is not None, "chromium is not installed (apt-get install chromium)"
    to_browser_r, to_browser_w = os.pipe()
    from_browser_r, from_browser_w = os.pipe()
    flags = [
        "--headless",
        "--no-sandbox",  # CI runs as root
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--no-first-run",
        "--no-default-browser-check",
        "--disable-extensions",
        "--disable-background-networking",
        "--disable-component-update",
        "--remote-debugging-pipe",
        f"--user-data-dir={profile}",
        f"--window-size={width},{height}",
        "about:blank",
    ]
    command = " ".join([binary, *flags]) + f" 3<&{to_browser_r} 4>&{from_browser_w}"
    process = await asyncio.create_subprocess_exec(
        "bash",
        "-c",
        f"exec {command}",
        pass_fds=(to_browser_r, from_browser_w),
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.DEVNULL,
    )
    os.close(to_browser_r)
    os.close(from_browser_w)
    reader = asyncio.StreamReader(limit=64 * 1024 * 1024)
    loop = asyncio.get_running_loop()
    transport, _ = await loop.connect_read_pipe(
        lambda: asyncio.StreamReaderProtocol(reader), os.fdopen(from_browser_r, "rb", 0)
    )
    page = Page(to_browser_w, reader)
    try:
        targets = await page.call("Target.getTargets", top=True)
        target = next(t for t in targets["targetInfos"] if t["type"] == "page")
        attached = await page.call(
            "Target.attachToTarget", {"targetId": target["targetId"], "flatten": True}, top=True
        )
        page.session = attached["sessionId"]
        await page.call("Page.enable")
        yield page
    finally:
        await page.close()
        transport.close()
        os.close(to_browser_w)
        if process.returncode is None:
            process.terminate()
            try:
                await asyncio.wait_for(process.wait(), 10)
            except TimeoutError:
                process.kill()
                await process.wait()
