"""Fixtures of the end-to-end tests."""

from __future__ import annotations

import pytest

from support.cache_page import find_chromium


@pytest.fixture(scope="session")
def chromium() -> str:
    """Debian's headless Chromium (installed when missing, as root); else a skip that says why."""
    found = find_chromium()
    if found is None:
        pytest.skip("no chromium: install Debian's chromium package (apt-get install chromium) to run the page test")
    return found
