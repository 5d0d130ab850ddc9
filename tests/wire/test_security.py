"""CURVE for tcp endpoints: key files and their permissions, `aioworker keys`, and the socket
options each side gets."""

from __future__ import annotations

import argparse
import logging
import os
import tomllib
from pathlib import Path

import pytest
import zmq
import zmq.asyncio

from aioworker.cli import keys as keys_cli
from aioworker.config import SecurityOptions, WorkerConfig, load_config
from aioworker.wire.security import (
    ClientSecurity,
    SecurityError,
    ServerSecurity,
    load_key_pair,
)
from tests.wire.curve import (
    tcp_config,
)

# -- keys -------------------------------------------------------------------------------------


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
