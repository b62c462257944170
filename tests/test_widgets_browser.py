"""Chapter 01's next-token explorer in a real browser.

JupyterLab runs on loopback with this venv's kernel; headless Chromium (Debian's package, driven by Playwright)
opens notebook 01, runs it up to the explorer, moves the sliders with the keyboard, and reads what the
widget shows: the kept-token line must be what the sampler keeps for the values the sliders show, and the
chart must be redrawn. A screenshot is saved in the test's tmp_path and, when ROSELLM_EDU_SCREENSHOTS names
a folder, there too.
"""

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from html import unescape
from pathlib import Path

import nbformat
import pytest
import torch

from rosellm_edu.layers.sampler import filtered_logits
from rosellm_edu.sampling_params import SamplingParams
from rosellm_edu.widgets import kept_tokens_text

sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed (pip install playwright)")

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOK = "notebooks/01_token_generation.ipynb"
CHROMIUM = os.environ.get("ROSELLM_EDU_CHROMIUM", "/usr/bin/chromium")
# On a closed network Chromium's background connections are refused (and slow it down); as root it needs
# --no-sandbox; there is no GPU.
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
# JupyterLab settings for a test run: never write the notebook back, ask nothing about news.
LAB_SETTINGS = {"docmanager-extension/plugin": {"autosave": False},
                "apputils-extension/notification": {"fetchNews": "false"}}
TIMEOUT_MS = 180_000

pytestmark = pytest.mark.skipif(not Path(CHROMIUM).is_file(),
                                reason=f"Chromium not found at {CHROMIUM} (apt-get install chromium)")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def write_lab_settings(settings_dir: Path) -> None:
    for plugin, values in LAB_SETTINGS.items():
        path = settings_dir / "@jupyterlab" / f"{plugin}.jupyterlab-settings"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(values))


@pytest.fixture(scope="module")
def lab_url(tmp_path_factory):
    """A JupyterLab server on loopback, without token or password, rooted at the repository."""
    tmp = tmp_path_factory.mktemp("lab")
    write_lab_settings(tmp / "settings")
    port = free_port()
    env = dict(os.environ, HF_HUB_OFFLINE="1", JUPYTER_CONFIG_DIR=str(tmp / "config"),
               JUPYTER_RUNTIME_DIR=str(tmp / "runtime"))
    log = (tmp / "lab.log").open("w")
    lab = subprocess.Popen(
        [sys.executable, "-m", "jupyterlab", "--no-browser", "--ServerApp.ip=127.0.0.1", f"--ServerApp.port={port}",
         "--ServerApp.port_retries=0", "--IdentityProvider.token=", "--ServerApp.allow_root=True",
         f"--ServerApp.root_dir={ROOT}", f"--LabApp.user_settings_dir={tmp / 'settings'}",
         f"--LabApp.workspaces_dir={tmp / 'workspaces'}", "--LabApp.news_url=None",
         "--LabApp.check_for_updates_class=jupyterlab.handlers.announcements.NeverCheckForUpdate",
         "--LabApp.extension_manager=readonly"],
        env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            assert lab.poll() is None, f"JupyterLab exited:\n{(tmp / 'lab.log').read_text()[-3000:]}"
            assert time.monotonic() < deadline, "JupyterLab did not answer within 120 s"
            try:
                urllib.request.urlopen(f"{url}/api/status", timeout=2)
                break
            except OSError:
                time.sleep(0.5)
        yield url
    finally:
        lab.terminate()  # the server shuts its kernels down on SIGTERM
        lab.wait(timeout=30)
        log.close()


@pytest.fixture
def page(lab_url):
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        page.set_default_timeout(TIMEOUT_MS)
        yield page
        browser.close()


def explorer_cell_index() -> int:
    cells = nbformat.read(ROOT / NOTEBOOK, as_version=4).cells
    return next(i for i, c in enumerate(cells) if c.cell_type == "code" and "NextTokenExplorer(" in c.source)


def run_up_to(page, cell):
    """Select the cell, run every cell above it from the Run menu, then run it."""
    cell.locator(".jp-InputPrompt").click()
    page.locator(".lm-MenuBar-itemLabel", has_text="Run").click()
    page.locator(".lm-Menu-itemLabel", has_text="Run All Above Selected Cell").click()
    page.keyboard.press("Shift+Enter")


def slider(explorer, name: str):
    return explorer.locator(".widget-slider").filter(has=explorer.page.locator(".widget-label", has_text=name))


def press(explorer, name: str, key: str, times: int) -> None:
    handle = slider(explorer, name).get_by_role("slider")
    handle.focus()
    for _ in range(times):
        handle.press(key)


def readout(explorer, name: str) -> float:
    return float(slider(explorer, name).locator(".widget-readout").inner_text())


def expected_kept_line(explorer, our_model, tokenizer) -> str:
    """The kept-token line, as text, for the prompt and slider values the page shows, computed here."""
    prompt = explorer.locator(".widget-text input").input_value()
    params = SamplingParams(temperature=readout(explorer, "temperature"), top_k=int(readout(explorer, "top_k")),
                            top_p=readout(explorer, "top_p"))
    ids = torch.tensor(tokenizer(prompt).input_ids)
    with torch.no_grad():
        logits = our_model.compute_logits(our_model(ids, torch.arange(len(ids)))[-1]).float()
    probs = filtered_logits(logits, params).softmax(-1)
    kept = probs.nonzero().flatten()
    kept = kept[probs[kept].argsort(descending=True)].tolist()
    return unescape(re.sub(r"<[^>]+>", "", kept_tokens_text(tokenizer, kept)))


def assert_shows_what_the_sampler_keeps(page, explorer, kept, our_model, tokenizer) -> None:
    """Wait until the kernel has caught up with the sliders (each key press is one update), then compare."""
    want = expected_kept_line(explorer, our_model, tokenizer)
    try:
        page.wait_for_function("([el, want]) => el.textContent.trim() === want",
                               arg=[kept.element_handle(), want], timeout=60_000)
    except sync_api.TimeoutError:
        pass  # the assertion below shows the difference
    assert kept.text_content().strip() == want


def wait_for_new_chart(page, chart, old_src: str) -> None:
    sync_api.expect(chart).not_to_have_attribute("src", old_src)
    page.wait_for_function("img => img.complete && img.naturalWidth > 0", arg=chart.element_handle())


def test_sliders_redraw_the_chart_and_the_kept_tokens_in_jupyterlab(page, lab_url, our_model, tokenizer, tmp_path):
    notebook_bytes = (ROOT / NOTEBOOK).read_bytes()
    page.goto(f"{lab_url}/lab/tree/{NOTEBOOK}")
    page.locator("#jp-main-statusbar").get_by_text(re.compile(r"\| Idle")).wait_for()  # the kernel is up
    cell = page.locator(".jp-Notebook .jp-Cell").nth(explorer_cell_index())
    run_up_to(page, cell)

    explorer = cell.locator(".jp-OutputArea .widget-vbox").first
    kept = explorer.locator(".widget-html", has_text="tokens kept")
    chart = explorer.locator(".widget-image")
    kept.wait_for()
    chart.wait_for()
    assert_shows_what_the_sampler_keeps(page, explorer, kept, our_model, tokenizer)

    # top_p below 1 first, so that temperature changes which tokens are kept
    press(explorer, "top_p", "ArrowLeft", 2)
    assert readout(explorer, "top_p") < 1.0
    assert_shows_what_the_sampler_keeps(page, explorer, kept, our_model, tokenizer)

    line, src, pixels = kept.text_content(), chart.get_attribute("src"), chart.screenshot()
    temperature = readout(explorer, "temperature")
    press(explorer, "temperature", "ArrowRight", 4)
    assert readout(explorer, "temperature") > temperature
    assert_shows_what_the_sampler_keeps(page, explorer, kept, our_model, tokenizer)
    assert kept.text_content() != line
    wait_for_new_chart(page, chart, src)
    assert chart.screenshot() != pixels

    explorer.scroll_into_view_if_needed()
    shot = tmp_path / "next_token_explorer.png"
    page.screenshot(path=shot)
    if folder := os.environ.get("ROSELLM_EDU_SCREENSHOTS"):
        Path(folder).mkdir(parents=True, exist_ok=True)
        shutil.copy(shot, folder)
    assert (ROOT / NOTEBOOK).read_bytes() == notebook_bytes, "the browser run must not save the notebook"
