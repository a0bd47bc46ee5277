"""The cache page in a real browser: Debian's headless Chromium (installed when missing), the
page's DOM after it has polled for a while, and what it drew."""

from __future__ import annotations

import os
import shutil
import subprocess
from html.parser import HTMLParser

BROWSE_TIMEOUT_S = 120


def find_chromium() -> str | None:
    """Chromium's path, installed first with apt-get when missing and this is root; None when
    it cannot be had."""
    found = shutil.which("chromium")
    if found is None and os.geteuid() == 0 and shutil.which("apt-get"):
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        # a fresh machine's package lists may be empty: read them first
        for step in (["apt-get", "update", "-q"], ["apt-get", "install", "-y", "-q", "chromium"]):
            subprocess.run(step, capture_output=True, timeout=900, env=env)
        found = shutil.which("chromium")
    return found


class PageNodes(HTMLParser):
    """The icicle's blocks of a page's DOM, as their attribute dicts; the text of each element
    with an id; the options of each select, by its id."""

    def __init__(self) -> None:
        super().__init__()
        self.nodes: list[dict[str, str | None]] = []
        self.text_of: dict[str, str] = {}
        self.options_of: dict[str, list[str]] = {}
        self._open: str | None = None
        self._select = ""

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        found = dict(attrs)
        if "node" in (found.get("class") or "").split():
            self.nodes.append(found)
        if tag == "select":
            self._select = found.get("id") or ""
        if tag == "option":
            self.options_of.setdefault(self._select, []).append("")
        self._open = "option" if tag == "option" else found.get("id")

    def handle_endtag(self, tag: str) -> None:
        self._open = None

    def handle_data(self, data: str) -> None:
        if self._open == "option":
            self.options_of[self._select][-1] += data
        elif self._open:
            self.text_of[self._open] = self.text_of.get(self._open, "") + data


def browse(chromium: str, url: str, *flags: str) -> str:
    """Open ``url`` headless, let the page run (its polls) for a while of virtual time, and
    return what Chromium printed (the DOM with --dump-dom)."""
    cmd = [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--virtual-time-budget=4000", *flags, url]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=BROWSE_TIMEOUT_S)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def page_nodes(chromium: str, url: str) -> PageNodes:
    """The page at ``url`` (``/cache#key=KEY``) once it polls live."""
    parsed = PageNodes()
    parsed.feed(browse(chromium, url, "--dump-dom"))
    assert parsed.text_of.get("status", "").startswith("live"), parsed.text_of.get("status")
    return parsed
