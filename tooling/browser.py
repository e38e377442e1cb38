"""Headless Chromium from Debian's packages (chromium + chromium-driver), driven by selenium, for the dashboard.

Both paths are given to selenium, so it never looks for or downloads a browser or a driver. `missing()` says
in one line why no browser can run here (the test skips with it; `make test` installs the packages where
it is root and apt-get exists, see scripts/setup.sh). Used by tests/test_dashboard_browser.py and
benchmarks/dashboard_load.py.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path

# the flags that work as root in a container; no network beyond the page's own origin
CHROMIUM_FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync",
                  "--disable-dev-shm-usage", "--disable-extensions", "--mute-audio")


def browser_paths() -> tuple[str | None, str | None]:
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    driver = shutil.which("chromedriver") or ("/usr/bin/chromedriver" if Path("/usr/bin/chromedriver").exists()
                                              else None)
    return chromium, driver


def missing() -> str | None:
    """Why no browser test can run here, or None."""
    try:
        import selenium  # noqa: F401
    except ImportError:
        return "selenium is not installed (pip install -e '.[dev]')"
    chromium, driver = browser_paths()
    if chromium is None or driver is None:
        return ("Debian's chromium and chromium-driver are not installed (as root: apt-get install -y chromium "
                "chromium-driver; `make test` does it where it can)")
    return None


@contextmanager
def chromium(width: int = 1400, height: int = 1000):
    """A fresh headless Chromium (new profile: cold cache) driven by selenium; closed on exit."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    binary, driver_path = browser_paths()
    os.environ.setdefault("SE_OFFLINE", "true")  # selenium-manager, if ever asked, must not reach the network
    profile = tempfile.mkdtemp(prefix="swarm-node-chromium-")
    opts = webdriver.ChromeOptions()
    opts.binary_location = binary
    for flag in (*CHROMIUM_FLAGS, f"--user-data-dir={profile}", f"--window-size={width},{height}"):
        opts.add_argument(flag)
    driver = webdriver.Chrome(service=Service(executable_path=driver_path), options=opts)
    try:
        driver.set_page_load_timeout(60)
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)
