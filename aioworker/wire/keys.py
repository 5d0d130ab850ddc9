"""CURVE key files: key pairs and public keys in zmq.auth's z85 text files, and the directories
of keys admitted to a deployment, each checked so that a secret is never readable by others and
a directory of admitted keys is never writable by them."""

from __future__ import annotations

import logging
import os
import stat
from dataclasses import dataclass
from pathlib import Path

import zmq.auth
from zmq.utils import z85

from aioworker.config import ConfigError

log = logging.getLogger(__name__)


class SecurityError(ConfigError):
    """A key file or directory is missing, malformed or readable by others; the message names it."""


@dataclass(frozen=True)
class KeyPair:
    # Both z85 text, 40 bytes each.
    public_key: bytes
    secret_key: bytes


# -- key files --------------------------------------------------------------------------------


def load_key_pair(
    secret_file: str, setting: str, public_file: str = "", public_setting: str = ""
) -> KeyPair:
    """The pair in a `.key_secret` file (owner-only), checked against `public_file` if given."""
    path = _existing_file(secret_file, setting)
    check_secret_file_mode(path, setting)
    public_key, secret_key = _read_certificate(path, setting)
    if secret_key is None:
        raise SecurityError(
            f"{setting}: {path} holds no secret key; give the .key_secret file, not the public .key"
        )
    _check_z85(secret_key, path, setting)
    if public_file and load_public_key(public_file, public_setting) != public_key:
        raise SecurityError(
            f"{public_setting}: {public_file} is not the public key of {setting} ({path}); "
            "give the .key file written with it, or leave the setting empty"
        )
    return KeyPair(public_key, secret_key)


def load_public_key(public_file: str, setting: str) -> bytes:
    path = _existing_file(public_file, setting)
    public_key, _ = _read_certificate(path, setting)
    return public_key


def check_secret_file_mode(path: Path, setting: str) -> None:
    mode = stat.S_IMODE(path.stat().st_mode)
    if mode & 0o077:
        raise SecurityError(
            f"{setting}: secret key file {path} is open to group or others (mode {mode:04o}); "
            f"make it private with `chmod 600 {path}`"
        )


def read_authorized_keys(directory: Path) -> set[bytes]:
    """The z85 public keys of the `*.key` files in `directory`. A file without a valid key is
    skipped here (read at every handshake); the worker warns about it once, at start."""
    keys = set()
    for path in directory.glob("*.key"):
        try:
            keys.add(_read_certificate(path, "security.authorized_clients_dir")[0])
        except SecurityError:
            continue
    return keys


def _existing_file(name: str, setting: str) -> Path:
    if not name:
        raise SecurityError(
            f"{setting} is empty, but [security] is configured; give the key file "
            "(`aioworker keys DIR` writes a set), or leave every security key empty"
        )
    path = Path(name).expanduser()
    if not path.is_file():
        raise SecurityError(f"{setting}: key file {path} does not exist")
    return path


def _read_certificate(path: Path, setting: str) -> tuple[bytes, bytes | None]:
    try:
        public_key, secret_key = zmq.auth.load_certificate(path)
    except (OSError, ValueError) as exc:
        raise SecurityError(f"{setting}: cannot read a CURVE key from {path}: {exc}") from exc
    _check_z85(public_key, path, setting)
    return public_key, secret_key


def _check_z85(key: bytes, path: Path, setting: str) -> None:
    try:
        is_key = len(key) == 40 and len(z85.decode(key)) == 32
    except (ValueError, KeyError):
        is_key = False
    if not is_key:
        raise SecurityError(f"{setting}: {path} holds a malformed key (40 z85 characters expected)")


def key_directory(name: str, setting: str, holds: str) -> Path:
    """A directory of admitted public keys: it must exist, be ours, and be writable by nobody
    else (whoever can add a file there can let anyone in)."""
    directory = Path(name).expanduser()
    if not directory.is_dir():
        raise SecurityError(f"{setting}: directory {directory} does not exist")
    info = directory.stat()
    mode = stat.S_IMODE(info.st_mode)
    if info.st_uid != os.getuid() or mode & 0o022:
        raise SecurityError(
            f"{setting}: {directory} must be owned by uid {os.getuid()} and writable by nobody "
            f"else (it is uid {info.st_uid}, mode {mode:04o}); `chmod 700 {directory}`"
        )
    for path in directory.glob("*.key"):
        try:
            _read_certificate(path, setting)
        except SecurityError as exc:
            log.warning("%s; that key cannot connect", exc)
    if not read_authorized_keys(directory):
        log.warning("%s: %s holds no .key file yet: no %s can connect", setting, directory, holds)
    return directory
