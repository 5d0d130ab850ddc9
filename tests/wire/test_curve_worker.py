"""CURVE end to end: a real worker process serves its clients and nobody else."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
import uuid

import pytest

from aioworker.cli import keys as keys_cli
from aioworker.config import WorkerConfig, load_config
from aioworker.core.sampling_params import SamplingParams
from aioworker.wire import admin_client
from aioworker.wire.client import Client
from aioworker.wire.protocol import AdminRequest
from tests.wire.curve import (
    free_port_block,
    security_settings,
)

# -- end to end: a real worker process --------------------------------------------------------


def wait_ready(config: WorkerConfig, process: subprocess.Popen, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        assert process.poll() is None, process.stderr.read()[-2000:]
        result = admin_client.send(config, 0, AdminRequest(command="status"), 0.5)
        if result.is_reachable and result.reply.data.get("state") == "READY":
            return
        time.sleep(0.05)
    raise TimeoutError(f"worker not READY after {timeout_s}s")


@pytest.mark.slow
def test_a_curve_worker_serves_its_clients_and_nobody_else(
    key_files: keys_cli.KeyFiles, intruder_files: keys_cli.KeyFiles
) -> None:
    settings = {
        "runtime.transport": "tcp",
        "runtime.base_port": free_port_block(6),
        "runtime.name": f"sec{uuid.uuid4().hex[:8]}",
        "runtime.heartbeat_interval_s": 0.2,
        **security_settings(key_files),
    }
    config = load_config(overrides=settings)
    admin_config = load_config(
        overrides={**settings, **security_settings(key_files, as_admin=True)}
    )
    intruder_config = load_config(
        overrides={**settings, **security_settings(key_files, intruder_files)}
    )
    set_args = [arg for key, value in settings.items() for arg in ("--set", f"{key}={value!r}")]
    command = [sys.executable, "-m", "aioworker.cli.main", "worker", "--rank", "0"]
    process = subprocess.Popen(
        [*command, "--fake-executor", *set_args], stderr=subprocess.PIPE, text=True
    )
    params = SamplingParams(max_tokens=4, ignore_eos=True)

    async def generate(client_config: WorkerConfig, timeout_s: float):
        async with Client.from_config(client_config) as client:
            return await asyncio.wait_for(client.generate([1, 2, 3], params), timeout_s)

    try:
        wait_ready(admin_config, process)
        completion = asyncio.run(generate(config, 10))
        assert (len(completion.token_ids), completion.finish_reason) == (4, "length")
        with pytest.raises(TimeoutError):
            asyncio.run(generate(intruder_config, 1))
        status = AdminRequest(command="status")
        assert admin_client.send(admin_config, 0, status, 5.0).reply.ok
        assert not admin_client.send(config, 0, status, 0.5).is_reachable  # a client, no admin
        assert not admin_client.send(intruder_config, 0, status, 0.5).is_reachable
        plain = load_config(overrides={k: v for k, v in settings.items() if "security" not in k})
        assert not admin_client.send(plain, 0, status, 0.5).is_reachable
    finally:
        process.send_signal(signal.SIGTERM)
        code = process.wait(20)
        process.stderr.close()
    assert code == 0


def test_a_worker_with_an_open_secret_key_exits_2_naming_it(
    key_files: keys_cli.KeyFiles,
) -> None:
    os.chmod(key_files.server_secret, 0o644)
    settings = {"runtime.transport": "tcp", **security_settings(key_files)}
    set_args = [arg for key, value in settings.items() for arg in ("--set", f"{key}={value!r}")]
    command = [sys.executable, "-m", "aioworker.cli.main", "worker", "--rank", "0"]
    result = subprocess.run(
        [*command, "--fake-executor", *set_args], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 2
    assert f"chmod 600 {key_files.server_secret}" in result.stderr
