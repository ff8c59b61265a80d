"""JupyterLab on localhost for browser tests: a server on a free port serving one folder
(token off, this checkout's mtwork on the kernel's path), and headless Chromium driven by
Playwright (Debian's /usr/bin/chromium, never a downloaded browser)."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                 "--disable-background-networking", "--disable-component-update",
                 "--disable-sync"]
REPO = Path(__file__).resolve().parents[2]

# Waits until the notebook open in JupyterLab has a running kernel.
KERNEL_READY = (
    "() => window.jupyterapp && window.jupyterapp.shell.currentWidget"
    " && window.jupyterapp.shell.currentWidget.sessionContext"
    " && window.jupyterapp.shell.currentWidget.sessionContext.session"
    " && window.jupyterapp.shell.currentWidget.sessionContext.session.kernel")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def serve_lab(work: Path, scratch: Path) -> Iterator[str]:
    """JupyterLab serving `work` (its settings, runtime files and log in `scratch`);
    yields its URL and stops it afterwards."""
    port = free_port()
    env = dict(os.environ, MTWORK_BACKEND="sim", JUPYTER_RUNTIME_DIR=str(scratch / "runtime"),
               JUPYTERLAB_SETTINGS_DIR=str(scratch / "settings"),
               JUPYTERLAB_WORKSPACES_DIR=str(scratch / "workspaces"))
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    log_path = scratch / "lab.log"
    with log_path.open("w") as log:
        server = subprocess.Popen(
            [sys.executable, "-m", "jupyterlab", "--no-browser", f"--port={port}",
             "--ip=127.0.0.1", "--ServerApp.port_retries=0", "--IdentityProvider.token=",
             "--ServerApp.password=", "--ServerApp.allow_root=True", "--expose-app-in-browser",
             f"--ServerApp.root_dir={work}", "--LabApp.news_url=None",
             "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate"],
            cwd=work, env=env, stdout=log, stderr=subprocess.STDOUT)
        url = f"http://127.0.0.1:{port}"
        try:
            _wait_until_up(url, server, log_path)
            yield url
        finally:
            server.terminate()
            try:
                server.wait(10)
            except subprocess.TimeoutExpired:
                server.kill()


def _wait_until_up(url: str, server: subprocess.Popen, log_path: Path) -> None:
    deadline = time.monotonic() + 30
    while True:
        try:
            urllib.request.urlopen(f"{url}/api/status", timeout=1)
            return
        except OSError:
            if server.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"JupyterLab did not start:\n{log_path.read_text()}") from None
            time.sleep(0.2)


def wait_for_text(path: Path, text: str, timeout: float = 10) -> str:
    """`path`'s content once it holds `text` (a notebook saved from the browser)."""
    deadline = time.monotonic() + timeout
    while True:
        content = path.read_text() if path.is_file() else ""
        if text in content or time.monotonic() > deadline:
            assert text in content, f"{path.name} was not saved with {text!r}"
            return content
        time.sleep(0.2)
