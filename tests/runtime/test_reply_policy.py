"""A driver connects only where a client asked from: reply_to on the deployment's transport, in
its runtime directory, or on the address the request came from."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from aioworker.config import load_config
from aioworker.core.sampling_params import SamplingParams
from aioworker.runtime.reply_policy import ReplyNotAllowed, ReplyPolicy
from tests.runtime.inprocess import RawClient, run


def test_ipc_replies_stay_in_the_runtime_directory(tmp_path: Path) -> None:
    policy = ReplyPolicy(load_config(overrides={"runtime.runtime_dir": str(tmp_path)}))
    policy.check(f"ipc://{tmp_path}/client-1", None)
    with pytest.raises(ReplyNotAllowed, match="outside the runtime directory"):
        policy.check("ipc:///tmp/elsewhere/socket", None)
    with pytest.raises(ReplyNotAllowed, match="must be a ipc:// endpoint"):
        policy.check("tcp://10.0.0.9:80", None)


def test_tcp_replies_go_to_the_requests_own_address_or_the_allowed_hosts() -> None:
    policy = ReplyPolicy(load_config(overrides={"runtime.transport": "tcp"}))
    policy.check("tcp://10.0.0.5:7000", "10.0.0.5")
    with pytest.raises(ReplyNotAllowed, match="not the address the request came from"):
        policy.check("tcp://10.0.0.99:22", "10.0.0.5")
    listed = {"runtime.transport": "tcp", "security.reply_hosts": ["10.0.0.99"]}
    ReplyPolicy(load_config(overrides=listed)).check("tcp://10.0.0.99:7000", "10.0.0.5")


def test_a_request_with_a_forbidden_reply_to_is_refused_unanswered(inproc_config) -> None:
    async def scenario(group, client):
        raw = RawClient(group.config, "ok")
        raw.reply_to = "ipc:///tmp/not-the-runtime-dir"
        try:
            await raw.submit("r", [1, 2], SamplingParams(max_tokens=2))
            await asyncio.sleep(0.3)
            return (await group.admin("status")).data, group.driver.results.num_sockets
        finally:
            raw.close()

    (status, num_sockets), _ = run(scenario, inproc_config)
    assert status["num_rejected_frames"] == 1 and status["num_requests"] == 0
    assert num_sockets == 0  # it never even connected
