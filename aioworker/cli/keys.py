"""`aioworker keys DIR`: write a server and a client CURVE key pair (zmq.auth's z85 files) for a
tcp deployment, and print the [security] lines that use them. Torch-free."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import zmq.auth

from aioworker.cli.common import fail

AUTHORIZED_CLIENTS = "authorized_clients"


@dataclass(frozen=True)
class KeyFiles:
    server_public: Path
    server_secret: Path
    client_public: Path
    client_secret: Path
    authorized_clients_dir: Path


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("directory", metavar="DIR", help="where to write the keys (created 0700)")
    parser.add_argument(
        "--client",
        default="client",
        metavar="NAME",
        help="file name of the client pair (default: client)",
    )
    parser.add_argument(
        "--client-only",
        action="store_true",
        help="write one more client pair into DIR, beside an existing server pair, and authorize it",
    )


def run(args: argparse.Namespace) -> int:
    try:
        files = write_keys(Path(args.directory), args.client, args.client_only)
    except (OSError, ValueError) as exc:
        return fail(str(exc))
    print(describe(files, args.client_only))
    return 0


def write_keys(directory: Path, client: str, client_only: bool = False) -> KeyFiles:
    """Write the pairs (secret files 0600) and copy the client's public key into
    DIR/authorized_clients; existing files are never overwritten."""
    if not client or "/" in client or client.startswith("."):
        raise ValueError(f"--client {client!r} must be a plain file name")
    if client == "server":
        raise ValueError("--client server would overwrite the server pair; choose another name")
    directory = directory.expanduser().absolute()
    authorized = directory / AUTHORIZED_CLIENTS
    files = KeyFiles(
        directory / "server.key",
        directory / "server.key_secret",
        directory / f"{client}.key",
        directory / f"{client}.key_secret",
        authorized,
    )
    new_files = [files.client_public, files.client_secret, authorized / files.client_public.name]
    if client_only and not files.server_public.is_file():
        raise ValueError(f"{files.server_public} does not exist; run `aioworker keys {directory}`")
    if not client_only:
        new_files += [files.server_public, files.server_secret]
    for path in new_files:
        if path.exists():
            raise ValueError(f"{path} already exists; remove it or choose another DIR or --client")
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    authorized.mkdir(mode=0o700, exist_ok=True)
    if not client_only:
        _create_pair(directory, "server")
    _create_pair(directory, client)
    shutil.copyfile(files.client_public, authorized / files.client_public.name)
    return files


def _create_pair(directory: Path, name: str) -> None:
    """create_certificates writes the secret file with the umask's mode: write it in a private
    directory, make it 0600, then move both files into place."""
    staging = Path(tempfile.mkdtemp(prefix=".keys-", dir=directory))
    try:
        public_file, secret_file = zmq.auth.create_certificates(staging, name)
        os.chmod(secret_file, 0o600)
        os.replace(public_file, directory / Path(public_file).name)
        os.replace(secret_file, directory / Path(secret_file).name)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def describe(files: KeyFiles, client_only: bool = False) -> str:
    rows = [
        (files.client_secret, "client secret key (0600): for the client only"),
        (files.client_public, "client public key"),
        (files.authorized_clients_dir / files.client_public.name, "the client, authorized"),
    ]
    settings = [
        ("server_secret_key_file", files.server_secret),
        ("server_public_key_file", files.server_public),
        ("authorized_clients_dir", files.authorized_clients_dir),
        ("client_secret_key_file", files.client_secret),
        ("client_public_key_file", files.client_public),
    ]
    if client_only:
        settings = [item for item in settings if item[0].startswith(("client", "server_public"))]
    else:
        rows[:0] = [
            (files.server_secret, "server secret key (0600): for the worker hosts only"),
            (files.server_public, "server public key: every client needs it"),
        ]
    width = max(len(str(path)) for path, _ in rows)
    return "\n".join(
        [
            "wrote:",
            *(f"  {str(path).ljust(width)}  {what}" for path, what in rows),
            "",
            "[security]",
            # A JSON string is a valid TOML basic string.
            *(f"{key} = {json.dumps(str(path))}" for key, path in settings),
            "",
            'CURVE applies to runtime.transport = "tcp". A client on another host needs only the',
            "server_public_key_file and client_* lines and their files; keep server.key_secret off it.",
        ]
    )
