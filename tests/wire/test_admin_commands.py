"""One table of admin commands: the protocol accepts exactly its commands, the driver handles
each, and `aioworker admin` offers each with its usage."""

from __future__ import annotations

import pytest

from aioworker.cli.admin import EPILOG
from aioworker.runtime import admin as admin_runtime
from aioworker.wire.admin_client import LONG_TIMEOUT_S, default_timeout
from aioworker.wire.admin_commands import ADMIN_COMMANDS, LONG_COMMANDS
from aioworker.wire.protocol import ADMIN_DECODER, AdminRequest, ProtocolError, encode


def test_the_protocol_accepts_the_tables_commands_and_no_other() -> None:
    for command in ADMIN_COMMANDS:
        assert ADMIN_DECODER.decode(encode(AdminRequest(command=command))).command == command
    with pytest.raises(ProtocolError, match="command"):
        ADMIN_DECODER.decode(encode(AdminRequest(command="reboot")))


def test_the_driver_handles_every_command_once() -> None:
    short = set(admin_runtime._HANDLERS) | {"status", "set-log-level"}
    assert short | LONG_COMMANDS == set(ADMIN_COMMANDS)
    assert not short & LONG_COMMANDS


def test_the_cli_shows_every_usage_and_waits_longer_for_long_commands() -> None:
    for command, info in ADMIN_COMMANDS.items():
        assert info.usage in EPILOG
        assert (default_timeout(command) == LONG_TIMEOUT_S) == info.is_long
