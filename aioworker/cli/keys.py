"""`aioworker keys DIR`: write a server, a client and an admin CURVE key pair (zmq.auth's z85
files) for a tcp deployment, and print the [security] lines that use them. Torch-free."""

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
ADMIN_CLIENTS = "admin_clients"
ADMIN = "admin"


@dataclass(frozen=True)
class KeyFiles:
    server_public: Path
    server_secret: Path
    client_public: Path
    client_secret: Path
    authorized_clients_dir: Path
    admin_clients_dir: Path
    # The admin pair: what an operator's tools present (admin commands need it).
    admin_public: Path
    admin_secret: Path


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
    parser.add_argument(
        "--admin",
        action="store_true",
        help="with --client-only: authorize the new pair for admin commands too (admin_clients/)",
    )


def run(args: argparse.Namespace) -> int:
    try:
        files = write_keys(Path(args.directory), args.client, args.client_only, args.admin)
    except (OSError, ValueError) as exc:
        return fail(str(exc))
    print(describe(files, args.client_only, args.admin))
    return 0


def write_keys(
    directory: Path, client: str, client_only: bool = False, admin: bool = False
) -> KeyFiles:
    """Write the pairs (secret files 0600): the server's, the client's (its public key copied
    into DIR/authorized_clients, or DIR/admin_clients with `admin`), and, for a new deployment,
    an admin pair in DIR/admin_clients. Existing files are never overwritten."""
    if not client or "/" in client or client.startswith("."):
        raise ValueError(f"--client {client!r} must be a plain file name")
    if client in ("server", ADMIN):
        raise ValueError(
            f"--client {client} would overwrite a pair of its own; choose another name"
        )
    directory = directory.expanduser().absolute()
    files = KeyFiles(
        directory / "server.key",
        directory / "server.key_secret",
        directory / f"{client}.key",
        directory / f"{client}.key_secret",
        directory / AUTHORIZED_CLIENTS,
        directory / ADMIN_CLIENTS,
        directory / f"{ADMIN}.key",
        directory / f"{ADMIN}.key_secret",
    )
    client_dir = files.admin_clients_dir if admin else files.authorized_clients_dir
    pairs = (
        {client: client_dir}
        if client_only
        else {client: client_dir, ADMIN: files.admin_clients_dir}
    )
    _check_new(directory, files, pairs, client_only)
    for path in (directory, files.authorized_clients_dir, files.admin_clients_dir):
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
    if not client_only:
        _create_pair(directory, "server")
    for name, admitted_in in pairs.items():
        _create_pair(directory, name)
        shutil.copyfile(directory / f"{name}.key", admitted_in / f"{name}.key")
    return files


def _check_new(directory: Path, files: KeyFiles, pairs: dict[str, Path], client_only: bool) -> None:
    if client_only and not files.server_public.is_file():
        raise ValueError(f"{files.server_public} does not exist; run `aioworker keys {directory}`")
    new_files = [] if client_only else [files.server_public, files.server_secret]
    for name, admitted_in in pairs.items():
        new_files += [directory / f"{name}.key", directory / f"{name}.key_secret"]
        new_files.append(admitted_in / f"{name}.key")
    for path in new_files:
        if path.exists():
            raise ValueError(f"{path} already exists; remove it or choose another DIR or --client")


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


def describe(files: KeyFiles, client_only: bool = False, admin: bool = False) -> str:
    admitted_in = files.admin_clients_dir if admin else files.authorized_clients_dir
    rows = [
        (files.client_secret, "client secret key (0600): for the client only"),
        (files.client_public, "client public key"),
        (admitted_in / files.client_public.name, "the client, authorized"),
    ]
    settings = [
        ("server_secret_key_file", files.server_secret),
        ("server_public_key_file", files.server_public),
        ("authorized_clients_dir", files.authorized_clients_dir),
        ("admin_clients_dir", files.admin_clients_dir),
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
        rows += [
            (files.admin_secret, "admin secret key (0600): for operators' tools only"),
            (files.admin_clients_dir / files.admin_public.name, "the admin, authorized"),
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
            f"Admin commands need an admin key: an operator's config sets client_secret_key_file = "
            f"{json.dumps(str(files.admin_secret))}",
            f"and client_public_key_file = {json.dumps(str(files.admin_public))}.",
        ]
    )
