"""What the browser tests share: Debian's Chromium driven by Playwright, and an aiohttp app served from a thread.

Used by ``test_web_browser`` (our own page), ``test_web_frontend`` (the real frontend package) and
``test_comfyui_integration`` (a real ComfyUI).
"""

from __future__ import annotations

import asyncio
import os
import threading

CHROMIUM = os.environ.get("H3_CHROMIUM", "/usr/bin/chromium")
# the last four keep Chromium from trying to reach the (closed) network at start
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--no-first-run", "--disable-quic"]


def missing_browser_parts() -> list[str]:
    """What the browser tests need and this machine lacks (Chromium, the playwright package), in words."""
    missing = []
    if not (os.path.isfile(CHROMIUM) and os.access(CHROMIUM, os.X_OK)):
        missing.append(f"Chromium ({CHROMIUM})")
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        missing.append("the playwright Python package")
    return missing


class ThreadedServer:
    """An aiohttp app (``_app()``) on 127.0.0.1 at a random port, run by its own event loop in a daemon thread."""

    def __init__(self):
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self.port = None

    def _app(self):  # pragma: no cover - every server defines its routes
        raise NotImplementedError

    async def _closing(self) -> None:
        """Runs on the server's loop after it stopped, before the app is cleaned up (open websockets, ...)."""

    def _run(self):
        from aiohttp import web

        asyncio.set_event_loop(self._loop)
        runner = web.AppRunner(self._app())
        self._loop.run_until_complete(runner.setup())
        site = web.TCPSite(runner, "127.0.0.1", 0)
        self._loop.run_until_complete(site.start())
        self.port = site._server.sockets[0].getsockname()[1]
        self._ready.set()
        self._loop.run_forever()
        self._loop.run_until_complete(self._closing())
        self._loop.run_until_complete(runner.cleanup())

    def start(self):
        self._thread.start()
        assert self._ready.wait(10), f"{type(self).__name__} did not start"
        return self

    def stop(self):
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    @property
    def url(self):
        return f"http://127.0.0.1:{self.port}/"
