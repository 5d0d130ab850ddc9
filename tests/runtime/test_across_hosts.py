"""Ranks on two hosts: two network namespaces joined by a veth pair, made by the test, each rank
of a TP=2 group (gloo) in its own, over tcp with CURVE on every channel. The tokens equal TP=1."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from aioworker.cli import keys as keys_cli
from aioworker.core.sampling_params import SamplingParams
from tests.conftest import EMBEDDED_OVERRIDES
from tests.wire.curve import security_settings

PARAMS = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
# Runs in the driver's namespace: the prompts through the Client, the tokens printed as JSON.
CLIENT = """
import asyncio, json, sys
from aioworker.config import load_config
from aioworker.core.sampling_params import SamplingParams
from aioworker.wire.client import Client

async def main():
    config = load_config(overrides=json.loads(sys.argv[1]))
    params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    async with Client.from_config(config) as client:
        done = [await client.generate(p, params) for p in json.loads(sys.argv[2])]
    print(json.dumps([c.token_ids for c in done]))

asyncio.run(main())
"""


@dataclass(frozen=True)
class Host:
    namespace: str
    address: str
    interface: str

    def command(self, *argv: str) -> list[str]:
        return ["ip", "netns", "exec", self.namespace, *argv]


def ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True)


@pytest.fixture
def two_hosts() -> Iterator[tuple[Host, Host]]:
    if os.geteuid() != 0:
        pytest.skip("network namespaces need root (CI runs as root)")
    tag = uuid.uuid4().hex[:6]
    hosts = (
        Host(f"aiow{tag}a", "10.213.7.1", f"va{tag}"),
        Host(f"aiow{tag}b", "10.213.7.2", f"vb{tag}"),
    )
    try:
        for host in hosts:
            ip("netns", "add", host.namespace)
    except (subprocess.CalledProcessError, FileNotFoundError) as exc:
        pytest.skip(f"`ip netns` is unavailable here: {exc}")
    try:
        ip("link", "add", hosts[0].interface, "type", "veth", "peer", "name", hosts[1].interface)
        for host in hosts:
            ip("link", "set", host.interface, "netns", host.namespace)
            ip("-n", host.namespace, "addr", "add", f"{host.address}/24", "dev", host.interface)
            ip("-n", host.namespace, "link", "set", host.interface, "up")
            ip("-n", host.namespace, "link", "set", "lo", "up")
        yield hosts
    finally:
        for host in hosts:
            subprocess.run(["ip", "netns", "del", host.namespace], capture_output=True)


def overrides(model_dir: Path, hosts: tuple[Host, Host], keys: keys_cli.KeyFiles) -> dict:
    return {
        "model.path": str(model_dir),
        **EMBEDDED_OVERRIDES,
        "parallel.tensor_parallel_size": 2,
        "runtime.name": f"hosts{uuid.uuid4().hex[:6]}",
        "runtime.transport": "tcp",
        "runtime.rank_hosts": [host.address for host in hosts],
        "runtime.heartbeat_interval_s": 0.5,
        **security_settings(keys),
    }


def set_args(settings: dict) -> list[str]:
    return [
        arg for key, value in settings.items() for arg in ("--set", f"{key}={json.dumps(value)}")
    ]


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_tp_2_across_two_hosts_over_curve_equals_tp_1(
    two_hosts, embedded_engine, embedded_model_dir, tmp_path: Path
) -> None:
    keys = keys_cli.write_keys(tmp_path / "keys", "client")
    settings = overrides(embedded_model_dir, two_hosts, keys)
    admin_settings = {**settings, **security_settings(keys, as_admin=True)}
    prompts = [embedded_engine.encode(q, chat=True) for q in ("Name a color.", "Say hello.")]
    expected = [c.token_ids for c in embedded_engine.generate(prompts, [PARAMS] * 2)]
    aioworker = [sys.executable, "-m", "aioworker.cli.main"]
    ranks = []
    for rank, host in enumerate(two_hosts):
        env = {**os.environ, "GLOO_SOCKET_IFNAME": host.interface}
        command = host.command(*aioworker, "worker", "--rank", str(rank), *set_args(settings))
        log = (tmp_path / f"rank{rank}.log").open("w")
        ranks.append(subprocess.Popen(command, env=env, stdout=log, stderr=log))
    driver_host = two_hosts[0]
    try:
        ready = subprocess.run(
            driver_host.command(*aioworker, "admin", "wait-ready", "--timeout", "300")
            + set_args(admin_settings),
            capture_output=True,
            text=True,
        )
        assert ready.returncode == 0, ready.stderr + _logs(tmp_path)
        client = subprocess.run(
            driver_host.command(sys.executable, "-c", CLIENT, json.dumps(settings))
            + [json.dumps(prompts)],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert client.returncode == 0, client.stderr + _logs(tmp_path)
    finally:
        for process in ranks:
            process.terminate()
        codes = [process.wait(30) for process in ranks]
    assert json.loads(client.stdout) == expected
    assert codes == [0, 0], _logs(tmp_path)


def _logs(directory: Path) -> str:
    return "".join(
        f"\n--- {p.name}\n{p.read_text()[-3000:]}" for p in sorted(directory.glob("*.log"))
    )
