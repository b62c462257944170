"""`make lab` starts JupyterLab, as root too, at the address it prints.

The command is the Makefile's own (`make -s lab-command`, the line `make lab` runs after its set-up), started here
on a free port with a known token; the set-up step is not run, since it may reinstall.
"""

import os
import shlex
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
TOKEN = "test-token-0123456789"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def lab_command(port: int) -> list[str]:
    line = subprocess.run(["make", "-s", "lab-command", f"LAB_PORT={port}", f"LAB_TOKEN={TOKEN}"], cwd=ROOT,
                          capture_output=True, text=True, check=True).stdout.strip()
    return shlex.split(line)


def status(url: str) -> int:
    try:
        return urllib.request.urlopen(url, timeout=5).status
    except urllib.error.HTTPError as error:
        return error.code
    except OSError:  # not listening yet
        return 0


def test_the_lab_command_allows_root_exactly_when_run_as_root():
    assert ("--allow-root" in lab_command(8888)) == (os.getuid() == 0)


def test_make_lab_prints_the_address_it_serves():
    printed = subprocess.run(["make", "-n", "lab", "LAB_PORT=8123", f"LAB_TOKEN={TOKEN}"], cwd=ROOT,
                             capture_output=True, text=True, check=True).stdout
    assert f"http://127.0.0.1:8123/lab?token={TOKEN}" in printed


def test_the_lab_serves_lab_with_its_token_and_refuses_without(tmp_path):
    command = lab_command(port := free_port())
    assert Path(ROOT / command[0]).exists(), f"{command[0]} is missing: run make setup"
    env = dict(os.environ, JUPYTER_CONFIG_DIR=str(tmp_path / "config"), JUPYTER_RUNTIME_DIR=str(tmp_path / "runtime"),
               JUPYTERLAB_WORKSPACES_DIR=str(tmp_path / "workspaces"))
    log = (tmp_path / "lab.log").open("w")
    lab = subprocess.Popen(command, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while status(f"{base}/api/status?token={TOKEN}") != 200:
            assert lab.poll() is None, f"JupyterLab exited:\n{(tmp_path / 'lab.log').read_text()[-3000:]}"
            assert time.monotonic() < deadline, "JupyterLab did not answer within 120 s"
            time.sleep(0.5)
        assert status(f"{base}/lab?token={TOKEN}") == 200
        assert status(f"{base}/api/status") == 403
        assert status(f"{base}/api/status?token=wrong") == 403
    finally:
        os.killpg(lab.pid, signal.SIGTERM)  # the server and the kernels it started
        try:
            lab.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(lab.pid, signal.SIGKILL)
            pytest.fail("JupyterLab did not stop on SIGTERM")
        log.close()
