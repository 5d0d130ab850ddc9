"""The HTTP server as `aioworker api` runs it (uvicorn, our protocol and layers, a real socket)
and, unless asked not to, a fake-executor group, all on one event loop in a thread of the test:
no subprocess, so each test starts its own in a fraction of a second."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from pathlib import Path

import uvicorn

from aioworker.api.gateway import Gateway, ServedModel
from aioworker.api.server import listening_socket, server_config
from aioworker.checkpoint.tokenizer import Tokenizer
from aioworker.config import WorkerConfig
from aioworker.core.fake_executor import FAKE_VOCAB_SIZE
from aioworker.wire.client import Client
from tests.runtime.inprocess import InProcessGroup, inprocess_config

MODEL = "embedded"


class ServedGateway:
    """`with ServedGateway(tmp_path, tokenizer, {"api.max_headers": 10}) as served:` then
    `served.url`. `with_group=False`: no group behind it (every group MISSING)."""

    def __init__(
        self,
        runtime_dir: Path,
        tokenizer: Tokenizer,
        overrides: dict | None = None,
        with_group: bool = True,
        step_seconds: float = 0.0,
    ) -> None:
        self.config: WorkerConfig = inprocess_config(runtime_dir, **(overrides or {}))
        self.tokenizer = tokenizer
        self.with_group = with_group
        self.step_seconds = step_seconds
        self.sock = listening_socket("127.0.0.1", 0)
        self.port = self.sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.server: uvicorn.Server | None = None
        self.gateway: Gateway | None = None
        self.loop: asyncio.AbstractEventLoop | None = None
        self._failure: BaseException | None = None
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> ServedGateway:
        self._thread.start()
        deadline = time.monotonic() + 20
        while not (self.server and self.server.started and self._ready()):
            assert self._failure is None, self._failure
            assert time.monotonic() < deadline, "the in-process gateway did not start"
            time.sleep(0.02)
        return self

    def __exit__(self, *exc: object) -> None:
        assert self.server is not None
        self.server.should_exit = True
        self._thread.join(30)
        assert not self._thread.is_alive(), "the in-process gateway did not stop"
        if self._failure is not None:
            raise self._failure

    def _ready(self) -> bool:
        assert self.gateway is not None
        return not self.with_group or self.gateway.is_ready()

    def call(self, fn, *args):
        """Run `fn(*args)` on the server's loop and return its result (to read its state)."""
        assert self.loop is not None
        done = threading.Event()
        result = []
        self.loop.call_soon_threadsafe(lambda: (result.append(fn(*args)), done.set()))
        assert done.wait(5)
        return result[0]

    def _run(self) -> None:
        try:
            asyncio.run(self._main())
        except BaseException as exc:  # noqa: BLE001 - reported to the test
            self._failure = exc

    async def _main(self) -> None:
        self.loop = asyncio.get_running_loop()
        group = None
        if self.with_group:
            group = InProcessGroup(self.config, step_seconds=self.step_seconds)
            await asyncio.wait_for(group.ready(), 10)
        try:
            self.gateway = Gateway(
                Client.from_config(self.config),
                self.tokenizer,
                ServedModel(
                    (MODEL, "alias"), MODEL, self.config.model.max_model_len, FAKE_VOCAB_SIZE
                ),
                self.config.api,
            )
            self.server = uvicorn.Server(server_config(self.gateway))
            await self.server.serve(sockets=[self.sock])
        finally:
            if group is not None:
                await group.stop()


def raw_connection(url: str, timeout: float = 10.0) -> socket.socket:
    host, port = url.removeprefix("http://").split(":")
    return socket.create_connection((host, int(port)), timeout=timeout)


def read_until_closed(sock: socket.socket, timeout: float) -> tuple[bytes, float]:
    """Everything the server sends until it closes the connection, and how long that took."""
    started = time.monotonic()
    sock.settimeout(timeout)
    received = b""
    while True:
        try:
            chunk = sock.recv(65536)
        except ConnectionResetError:
            break
        if not chunk:
            break
        received += chunk
    return received, time.monotonic() - started
