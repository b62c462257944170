# Generated from notebooks/07_serving.ipynb by `python -m rosellm_edu.book.export`.
# Do not edit: change the notebooks' `#| export` cells and export again. Each item names its cell
# (cells counted from 1 in their notebook, markdown cells included).

import threading
import time

import uvicorn
from fastapi import FastAPI


# notebooks/07_serving.ipynb, cell 4
class ServerThread:
    """uvicorn serving an app from a background thread, on a free port: for notebooks and tests."""

    def __init__(self, app: FastAPI, host: str = "127.0.0.1", port: int = 0):
        self.server = uvicorn.Server(uvicorn.Config(app, host=host, port=port, log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, name="uvicorn", daemon=True)
        self.host = host

    def start(self, timeout: float = 30.0) -> str:
        """Start serving; return the base URL of the OpenAI API."""
        self.thread.start()
        deadline = time.monotonic() + timeout
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the server did not start")
            time.sleep(0.05)
        port = self.server.servers[0].sockets[0].getsockname()[1]
        return f"http://{self.host}:{port}/v1"

    def stop(self, timeout: float = 30.0) -> None:
        self.server.should_exit = True
        self.thread.join(timeout)
