"""CURVE on real ZeroMQ sockets on 127.0.0.1: only authorized keys get through, on the task,
admin and result paths."""

from __future__ import annotations

import asyncio
import queue
import threading
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
import zmq
import zmq.asyncio

from aioworker.cli import keys as keys_cli
from aioworker.core.outputs import FinishReason, RequestOutput
from aioworker.core.sampling_params import SamplingParams
from aioworker.wire.client import Client
from aioworker.wire.keys import load_key_pair
from aioworker.wire.protocol import TASK_DECODER, Outputs, encode
from aioworker.wire.security import (
    ClientSecurity,
    KeyPair,
    Role,
    ServerSecurity,
    client_key_of,
    recv_with_client_key,
    stop_authenticator,
)
from aioworker.wire.transport import bound_endpoint, make_socket
from tests.wire.curve import (
    ANSWER_WAIT_MS,
    ANY_PORT,
    REFUSED_WAIT_MS,
    free_port_block,
    tcp_config,
)

# -- real sockets: the task and admin path --------------------------------------------------


@contextmanager
def echo_server(security: ServerSecurity, role: Role = Role.CLIENTS) -> Iterator[str]:
    """A ROUTER on its own thread (context, authenticator and socket all live there) that answers
    every message with the key its sender authenticated with."""
    endpoints: queue.Queue[str] = queue.Queue()
    stopping = threading.Event()

    def serve() -> None:
        context = zmq.Context()
        authenticator = security.start_authenticator(context)
        sock = make_socket(
            context, zmq.ROUTER, bind=ANY_PORT, options=security.server_options(ANY_PORT, role)
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


# -- every channel, by role ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("role", "admitted"),
    [
        (Role.CLIENTS, {"client", "admin"}),
        (Role.ADMIN, {"admin"}),
        (Role.RANKS, {"rank"}),
        (Role.BEATS, {"rank", "client", "admin"}),
    ],
)
def test_each_channel_admits_only_its_keys(
    key_files: keys_cli.KeyFiles, role: Role, admitted: set[str]
) -> None:
    config = tcp_config(key_files)
    server = ServerSecurity.from_config(config)
    client = ClientSecurity.from_config(config)
    admin_keys = load_key_pair(str(key_files.admin_secret), "admin", str(key_files.admin_public))
    admin = ClientSecurity(admin_keys, server.keys.public_key)
    with echo_server(server, role) as endpoint:
        presenting = {
            "rank": server.rank_options(endpoint),
            "client": client.connect_options(endpoint),
            "admin": admin.connect_options(endpoint),
            "stranger": random_client(server.keys.public_key),
            "no key": {},
        }
        got_in = {
            who
            for who, options in presenting.items()
            if ask(endpoint, options, ANSWER_WAIT_MS if who in admitted else REFUSED_WAIT_MS)
        }
    assert got_in == admitted
