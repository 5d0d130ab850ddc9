"""CURVE for tcp endpoints: key files and their permissions, `aioworker keys`, and real ZeroMQ
sockets on 127.0.0.1 where only authorized keys get through, on the task, admin and result paths."""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import logging
import os
import queue
import random
import signal
import socket
import subprocess
import sys
import threading
import time
import tomllib
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import zmq
import zmq.asyncio

from aioworker.cli import keys as keys_cli
from aioworker.config import SecurityOptions, WorkerConfig, load_config
from aioworker.core.outputs import FinishReason, RequestOutput
from aioworker.core.sampling_params import SamplingParams
from aioworker.wire import admin_client
from aioworker.wire.client import Client
from aioworker.wire.protocol import TASK_DECODER, AdminRequest, Outputs, encode
from aioworker.wire.security import (
    ClientSecurity,
    KeyPair,
    SecurityError,
    ServerSecurity,
    client_key_of,
    load_key_pair,
    recv_with_client_key,
    stop_authenticator,
)
from aioworker.wire.transport import bound_endpoint, make_socket

ANY_PORT = "tcp://127.0.0.1:*"
# Long enough for a CURVE handshake on a loaded machine; a refused peer never answers anyway.
REFUSED_WAIT_MS = 500
ANSWER_WAIT_MS = 5000


# -- keys -------------------------------------------------------------------------------------


@pytest.fixture
def key_files(tmp_path: Path) -> keys_cli.KeyFiles:
    return keys_cli.write_keys(tmp_path / "keys", "client")


@pytest.fixture
def intruder_files(tmp_path: Path) -> keys_cli.KeyFiles:
    """A complete key set of another deployment: its client is not authorized for ours."""
    return keys_cli.write_keys(tmp_path / "other", "client")


def security_settings(files: keys_cli.KeyFiles, client: keys_cli.KeyFiles | None = None) -> dict:
    """[security] of `files`, with the client keys of `client` if given."""
    client = client or files
    return {
        "security.server_secret_key_file": str(files.server_secret),
        "security.server_public_key_file": str(files.server_public),
        "security.authorized_clients_dir": str(files.authorized_clients_dir),
        "security.client_secret_key_file": str(client.client_secret),
        "security.client_public_key_file": str(client.client_public),
    }


def tcp_config(files: keys_cli.KeyFiles, **overrides) -> WorkerConfig:
    settings = {"runtime.transport": "tcp", **security_settings(files), **overrides}
    return load_config(overrides=settings)


def test_keys_command_writes_private_secrets_and_authorizes_the_client(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    parser = argparse.ArgumentParser()
    keys_cli.add_arguments(parser)
    directory = tmp_path / "keys"
    assert keys_cli.run(parser.parse_args([str(directory)])) == 0
    out = capsys.readouterr().out

    assert oct(directory.stat().st_mode & 0o777) == "0o700"
    for name in ("server.key_secret", "client.key_secret"):
        assert oct((directory / name).stat().st_mode & 0o777) == "0o600"
    authorized = directory / "authorized_clients"
    assert sorted(p.name for p in authorized.iterdir()) == ["client.key"]
    assert (authorized / "client.key").read_text() == (directory / "client.key").read_text()
    # The printed [security] section is a config that loads on both sides.
    section = out[out.index("[security]") :].split("\n\n")[0]
    security = SecurityOptions(**tomllib.loads(section)["security"])
    config = load_config(overrides={"runtime.transport": "tcp"})
    config = WorkerConfig(runtime=config.runtime, security=security)
    assert ServerSecurity.from_config(config).is_enabled
    assert ClientSecurity.from_config(config).is_enabled
    assert str(directory / "server.key_secret") in out


def test_keys_command_never_overwrites_and_adds_clients(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    parser = argparse.ArgumentParser()
    keys_cli.add_arguments(parser)
    directory = str(tmp_path / "keys")
    assert keys_cli.run(parser.parse_args([directory])) == 0
    server_secret = (tmp_path / "keys" / "server.key_secret").read_text()

    assert keys_cli.run(parser.parse_args([directory])) == 2
    assert "already exists" in capsys.readouterr().err
    assert keys_cli.run(parser.parse_args([directory, "--client", "bob", "--client-only"])) == 0
    assert (tmp_path / "keys" / "server.key_secret").read_text() == server_secret
    assert (tmp_path / "keys" / "authorized_clients" / "bob.key").is_file()
    assert oct((tmp_path / "keys" / "bob.key_secret").stat().st_mode & 0o777) == "0o600"


def test_a_key_pair_loads_and_matches_its_public_file(key_files: keys_cli.KeyFiles) -> None:
    keys = load_key_pair(str(key_files.server_secret), "s", str(key_files.server_public), "p")
    assert len(keys.public_key) == len(keys.secret_key) == 40
    with pytest.raises(SecurityError, match="is not the public key of"):
        load_key_pair(str(key_files.server_secret), "s", str(key_files.client_public), "p")


def test_a_secret_file_readable_by_others_is_refused_naming_it(
    key_files: keys_cli.KeyFiles,
) -> None:
    os.chmod(key_files.server_secret, 0o644)
    with pytest.raises(SecurityError) as error:
        ServerSecurity.from_config(tcp_config(key_files))
    message = str(error.value)
    assert "security.server_secret_key_file" in message
    assert f"chmod 600 {key_files.server_secret}" in message
    assert "0644" in message


def test_missing_and_wrong_key_files_are_named(
    key_files: keys_cli.KeyFiles, tmp_path: Path
) -> None:
    missing = tmp_path / "nope.key_secret"
    config = tcp_config(key_files, **{"security.client_secret_key_file": str(missing)})
    with pytest.raises(SecurityError, match=f"client_secret_key_file: key file {missing} does"):
        ClientSecurity.from_config(config)
    public_as_secret = {"security.server_secret_key_file": str(key_files.server_public)}
    os.chmod(key_files.server_public, 0o600)
    with pytest.raises(SecurityError, match="holds no secret key"):
        ServerSecurity.from_config(tcp_config(key_files, **public_as_secret))
    garbage = tmp_path / "garbage.key"
    garbage.write_text("public-key = 'not a key'\n")
    with pytest.raises(SecurityError, match="malformed key"):
        ClientSecurity.from_config(
            tcp_config(key_files, **{"security.server_public_key_file": str(garbage)})
        )
    no_directory = {"security.authorized_clients_dir": str(tmp_path / "absent")}
    with pytest.raises(SecurityError, match="authorized_clients_dir: directory .* does not"):
        ServerSecurity.from_config(tcp_config(key_files, **no_directory))


def test_a_half_configured_side_names_what_it_lacks(key_files: keys_cli.KeyFiles) -> None:
    client_only = {
        "runtime.transport": "tcp",
        "security.server_public_key_file": str(key_files.server_public),
        "security.client_secret_key_file": str(key_files.client_secret),
    }
    assert ClientSecurity.from_config(load_config(overrides=client_only)).is_enabled
    with pytest.raises(SecurityError, match="security.server_secret_key_file is empty"):
        ServerSecurity.from_config(load_config(overrides=client_only))


def test_no_security_and_ipc_give_no_curve_options(
    key_files: keys_cli.KeyFiles, caplog: pytest.LogCaptureFixture
) -> None:
    plain = load_config(overrides={"runtime.transport": "tcp"})
    server, client = ServerSecurity.from_config(plain), ClientSecurity.from_config(plain)
    assert not server.is_enabled and not client.is_enabled
    endpoint = "tcp://127.0.0.1:5555"
    assert server.server_options(endpoint) == server.result_options(endpoint, None) == {}
    assert client.connect_options(endpoint) == client.result_options(endpoint) == {}
    assert server.start_authenticator(zmq.Context.instance()) is None
    # ipc with keys configured: allowed, ignored, said once (even unreadable keys are not read).
    ipc = load_config(overrides={"security.server_secret_key_file": "/nonexistent"})
    with caplog.at_level(logging.WARNING, logger="aioworker.wire.security"):
        assert not ServerSecurity.from_config(ipc).is_enabled
    assert "CURVE applies to tcp only" in caplog.text
    assert not ClientSecurity.from_config(ipc).is_enabled
    # A tcp deployment's options never touch an ipc endpoint.
    server = ServerSecurity.from_config(tcp_config(key_files))
    assert server.server_options("ipc:///tmp/x") == {}
    assert server.server_options("tcp://127.0.0.1:1")[zmq.CURVE_SERVER] == 1


def test_results_over_curve_need_the_requests_client_key(key_files: keys_cli.KeyFiles) -> None:
    server = ServerSecurity.from_config(tcp_config(key_files))
    with pytest.raises(ValueError, match="needs the key of an authenticated client"):
        server.result_options("tcp://127.0.0.1:5555", None)
    client_key = key_files.client_public.read_text().split('"')[1]
    options = server.result_options("tcp://127.0.0.1:5555", client_key)
    assert options[zmq.CURVE_SERVERKEY] == client_key.encode()
    assert options[zmq.CURVE_PUBLICKEY] == server.keys.public_key


def test_security_modules_import_no_torch() -> None:
    code = (
        "import aioworker.wire.security, aioworker.cli.keys, sys; assert 'torch' not in sys.modules"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


# -- real sockets: the task and admin path --------------------------------------------------


@contextmanager
def echo_server(security: ServerSecurity) -> Iterator[str]:
    """A ROUTER on its own thread (context, authenticator and socket all live there) that answers
    every message with the key its sender authenticated with."""
    endpoints: queue.Queue[str] = queue.Queue()
    stopping = threading.Event()

    def serve() -> None:
        context = zmq.Context()
        authenticator = security.start_authenticator(context)
        sock = make_socket(
            context, zmq.ROUTER, bind=ANY_PORT, options=security.server_options(ANY_PORT)
        )
        endpoints.put(bound_endpoint(sock))
        while not stopping.is_set():
            if sock.poll(20):
                frames = sock.recv_multipart(copy=False)
                key = client_key_of(frames[-1]) or "no key"
                sock.send_multipart([frames[0].bytes, key.encode()])
        sock.close()
        stop_authenticator(authenticator)
        context.term()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield endpoints.get(timeout=5)
    finally:
        stopping.set()
        thread.join(timeout=5)


def ask(endpoint: str, options: dict, wait_ms: int) -> list[bytes] | None:
    """One message from a DEALER with these socket options; the answer, or None."""
    context = zmq.Context()
    try:
        with make_socket(context, zmq.DEALER, connect=endpoint, options=options) as sock:
            sock.send(b"ping")
            return sock.recv_multipart() if sock.poll(wait_ms) else None
    finally:
        context.term()


def random_client(server_public_key: bytes) -> dict:
    public, secret = zmq.curve_keypair()
    return ClientSecurity(KeyPair(public, secret), server_public_key).connect_options(ANY_PORT)


def test_curve_admits_only_authorized_client_keys(
    key_files: keys_cli.KeyFiles, intruder_files: keys_cli.KeyFiles
) -> None:
    config = tcp_config(key_files)
    server = ServerSecurity.from_config(config)
    client = ClientSecurity.from_config(config)
    with echo_server(server) as endpoint:
        # The authorized client gets through, and the server sees its public key.
        answer = ask(endpoint, client.connect_options(endpoint), ANSWER_WAIT_MS)
        assert answer == [client.keys.public_key]
        # Unknown keys, NULL clients and clients expecting another server get nothing.
        assert ask(endpoint, random_client(server.keys.public_key), REFUSED_WAIT_MS) is None
        assert ask(endpoint, {}, REFUSED_WAIT_MS) is None
        intruder = ClientSecurity.from_config(tcp_config(intruder_files))
        assert ask(endpoint, intruder.connect_options(endpoint), REFUSED_WAIT_MS) is None
        # Authorized keys are read at each handshake: a key removed is refused from then on.
        (key_files.authorized_clients_dir / "client.key").unlink()
        assert ask(endpoint, client.connect_options(endpoint), REFUSED_WAIT_MS) is None


# -- real sockets: a request and its result, through the Client -------------------------------


async def serve_requests(
    context: zmq.asyncio.Context, tasks: zmq.asyncio.Socket, server: ServerSecurity
) -> list[str | None]:
    """What the driver does with CURVE on: answer each request over a result PUSH that connects
    with the key the request came with. Returns the keys seen."""
    seen = []
    while True:
        frames, client_key = await recv_with_client_key(tasks)
        seen.append(client_key)
        request = TASK_DECODER.decode(frames)
        output = RequestOutput(request.request_id, [7], FinishReason.LENGTH)
        options = server.result_options(request.reply_to, client_key)
        push = make_socket(context, zmq.PUSH, connect=request.reply_to, options=options)
        await push.send_multipart(encode(Outputs(group=0, outputs=[output])))
        push.close(linger=1000)


@contextmanager
def fake_driver_sockets(server: ServerSecurity) -> Iterator[tuple]:
    context = zmq.asyncio.Context()
    authenticator = server.start_authenticator(context)
    tasks = make_socket(context, zmq.PULL, bind=ANY_PORT, options=server.server_options(ANY_PORT))
    try:
        yield context, tasks
    finally:
        tasks.close()
        stop_authenticator(authenticator)
        context.term()


def test_a_request_and_its_result_travel_over_curve(
    key_files: keys_cli.KeyFiles, intruder_files: keys_cli.KeyFiles
) -> None:
    config = tcp_config(key_files)
    server = ServerSecurity.from_config(config)
    params = SamplingParams(max_tokens=1)

    async def scenario():
        with fake_driver_sockets(server) as (context, tasks):
            driver = asyncio.ensure_future(serve_requests(context, tasks, server))
            task_endpoint = bound_endpoint(tasks)
            try:
                client = ClientSecurity.from_config(config)
                async with Client([task_endpoint], ANY_PORT, client) as authorized:
                    completion = await asyncio.wait_for(authorized.generate([1, 2], params), 5)
                intruder = ClientSecurity.from_config(tcp_config(intruder_files))
                async with Client([task_endpoint], ANY_PORT, intruder) as refused:
                    with pytest.raises(TimeoutError):
                        await asyncio.wait_for(refused.generate([1, 2], params), 0.5)
            finally:
                driver.cancel()
                await asyncio.gather(driver, return_exceptions=True)
            return completion

    completion = asyncio.run(scenario())
    assert (completion.token_ids, completion.finish_reason) == ([7], "length")


def test_only_the_clients_key_opens_its_result_socket(
    key_files: keys_cli.KeyFiles, intruder_files: keys_cli.KeyFiles
) -> None:
    """A result PUSH that names another key cannot reach the client, and nobody but the driver
    (not even an authorized client) can push results into it."""
    config = tcp_config(key_files)
    server = ServerSecurity.from_config(config)
    client = ClientSecurity.from_config(config)
    client_key = client.keys.public_key.decode()
    intruder = ClientSecurity.from_config(tcp_config(intruder_files))
    intruder_key = intruder.keys.public_key.decode()
    # The intruder, as a server of a deployment of its own, pushing to our client.
    forged = ServerSecurity.from_config(tcp_config(intruder_files))

    async def scenario() -> list[bool]:
        context = zmq.asyncio.Context()
        authenticator = client.start_authenticator(context)
        options = client.result_options(ANY_PORT)
        results = make_socket(context, zmq.PULL, bind=ANY_PORT, options=options)
        endpoint = bound_endpoint(results)

        async def delivered(push_options: dict, wait_ms: int = REFUSED_WAIT_MS) -> bool:
            push = make_socket(context, zmq.PUSH, connect=endpoint, options=push_options)
            try:
                await push.send(b"result")
                return bool(await results.poll(wait_ms))
            finally:
                push.close()

        try:
            return [
                await delivered(server.result_options(endpoint, intruder_key)),
                await delivered(forged.result_options(endpoint, client_key)),
                await delivered(client.connect_options(endpoint)),
                await delivered({}),
                await delivered(server.result_options(endpoint, client_key), ANSWER_WAIT_MS),
            ]
        finally:
            results.close()
            stop_authenticator(authenticator)
            context.term()

    assert asyncio.run(scenario()) == [False, False, False, False, True]


def test_client_from_config_puts_curve_on_every_socket(key_files: keys_cli.KeyFiles) -> None:
    config = tcp_config(key_files, **{"runtime.base_port": free_port_block(6)})

    async def mechanisms() -> tuple:
        async with Client.from_config(config) as client:
            return (
                client._results.getsockopt(zmq.CURVE_SERVER),
                [push.getsockopt(zmq.MECHANISM) for push in client._pushes],
            )

    assert asyncio.run(mechanisms()) == (1, [zmq.CURVE])


# -- end to end: a real worker process --------------------------------------------------------


def uses_security(module: str) -> bool:
    """Whether `module` calls ServerSecurity yet (the integration lines of security.py)."""
    spec = importlib.util.find_spec(module)
    return "ServerSecurity" in Path(spec.origin).read_text()


def free_port_block(size: int) -> int:
    """A base port whose next `size` ports are free on 127.0.0.1 now."""
    rng = random.Random()
    for _ in range(100):
        base = rng.randrange(20000, 60000 - size)
        probes = [socket.socket() for _ in range(size)]
        try:
            for offset, probe in enumerate(probes):
                probe.bind(("127.0.0.1", base + offset))
            return base
        except OSError:
            continue
        finally:
            for probe in probes:
                probe.close()
    raise RuntimeError(f"no block of {size} free ports found")


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
@pytest.mark.skipif(
    not uses_security("aioworker.runtime.driver"),
    reason="aioworker/runtime/driver.py does not use security.py yet",
)
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
        wait_ready(config, process)
        completion = asyncio.run(generate(config, 10))
        assert (len(completion.token_ids), completion.finish_reason) == (4, "length")
        with pytest.raises(TimeoutError):
            asyncio.run(generate(intruder_config, 1))
        status = AdminRequest(command="status")
        assert not admin_client.send(intruder_config, 0, status, 0.5).is_reachable
        plain = load_config(overrides={k: v for k, v in settings.items() if "security" not in k})
        assert not admin_client.send(plain, 0, status, 0.5).is_reachable
    finally:
        process.send_signal(signal.SIGTERM)
        code = process.wait(20)
        process.stderr.close()
    assert code == 0


@pytest.mark.skipif(
    not uses_security("aioworker.cli.worker"),
    reason="aioworker/cli/worker.py does not check the server keys yet",
)
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
