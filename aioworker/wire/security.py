"""CURVE encryption and authentication for the tcp endpoints that clients and operators reach:
key files, the ZAP authenticator that admits only known keys, and each side's socket options.

The driver's task PULL and admin ROUTER are CURVE servers; a client presents its key pair. The
results go back over the driver's PUSH to the client's own PULL, which is a CURVE server too:
the driver connects to it with the key that the client authenticated with (the User-Id of its
task frames), so only the holder of that key's secret can receive them, and the client admits
only the driver's key. Torch-free.
"""

from __future__ import annotations

import logging
import stat
from dataclasses import dataclass
from pathlib import Path

import zmq
import zmq.asyncio
import zmq.auth
from zmq.auth.asyncio import AsyncioAuthenticator
from zmq.auth.base import Authenticator
from zmq.auth.thread import ThreadAuthenticator
from zmq.utils import z85

from aioworker.config import ConfigError, SecurityOptions, WorkerConfig

log = logging.getLogger(__name__)

# Socket option -> value, applied before a socket binds or connects.
SocketOptions = dict[int, int | bytes]


class SecurityError(ConfigError):
    """A key file or directory is missing, malformed or readable by others; the message names it."""


@dataclass(frozen=True)
class KeyPair:
    # Both z85 text, 40 bytes each.
    public_key: bytes
    secret_key: bytes


def is_configured(options: SecurityOptions) -> bool:
    """Any [security] key set turns CURVE on, for every role (a half-configured side fails fast)."""
    return any(getattr(options, name) for name in options.__struct_fields__)


def uses_curve(endpoint: str) -> bool:
    """Only tcp endpoints use CURVE; ipc relies on its 0700 runtime directory."""
    return endpoint.startswith("tcp://")


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


def _authorized_dir(name: str) -> Path:
    setting = "security.authorized_clients_dir"
    if not name:
        raise SecurityError(
            f"{setting} is empty, but [security] is configured; give the directory of the "
            "clients' public .key files"
        )
    directory = Path(name).expanduser()
    if not directory.is_dir():
        raise SecurityError(f"{setting}: directory {directory} does not exist")
    for path in directory.glob("*.key"):
        try:
            _read_certificate(path, setting)
        except SecurityError as exc:
            log.warning("%s; that client cannot connect", exc)
    if not read_authorized_keys(directory):
        log.warning(
            "%s: %s holds no client's .key file yet: no client can connect", setting, directory
        )
    return directory


# -- the ZAP authenticator --------------------------------------------------------------------


class _AuthorizedKeysDir:
    """ZAP credentials: a key is admitted while its .key file is in the directory (read at each
    handshake, so adding or removing a file needs no restart)."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._refused: set[bytes] = set()

    def callback(self, domain: str, key: bytes) -> bool:
        if key in read_authorized_keys(self.directory):
            return True
        if key not in self._refused and len(self._refused) < 1024:
            # A refused peer retries every 100 ms: say so once per key.
            self._refused.add(key)
            log.warning("refused a CURVE client: key %s is not in %s", key.decode(), self.directory)
        return False


class _OneKey:
    """ZAP credentials admitting one key: the driver's, at a client's result socket."""

    def __init__(self, key: bytes) -> None:
        self.key = key

    def callback(self, domain: str, key: bytes) -> bool:
        return key == self.key


def start_authenticator(context: zmq.Context, credentials: object) -> Authenticator:
    """A ZAP handler for every CURVE server socket of `context` (one per context): on the running
    loop for an asyncio context, else on its own thread. Without one, libzmq admits any key."""
    kind = AsyncioAuthenticator if isinstance(context, zmq.asyncio.Context) else ThreadAuthenticator
    authenticator = kind(context, log=log.getChild("zap"))
    authenticator.start()
    authenticator.configure_curve_callback(domain="*", credentials_provider=credentials)
    return authenticator


def stop_authenticator(authenticator: Authenticator | None) -> None:
    """Close the ZAP socket; must run before `context.term()`, which would wait for it forever."""
    if authenticator is not None:
        authenticator.stop()


def client_key_of(frame: zmq.Frame) -> str | None:
    """The z85 public key a received message's sender authenticated with; None without CURVE."""
    try:
        return frame.get("User-Id")
    except zmq.ZMQError:
        return None


async def recv_with_client_key(sock: zmq.asyncio.Socket) -> tuple[list[bytes], str | None]:
    """One multipart message and its sender's authenticated key (see `client_key_of`)."""
    frames = await sock.recv_multipart(copy=False)
    return [frame.bytes for frame in frames], client_key_of(frames[-1])


# -- the two sides ----------------------------------------------------------------------------


@dataclass(frozen=True)
class ServerSecurity:
    """The driver's side: its key pair and the directory of authorized client keys. Disabled
    (every method a no-op) when [security] is empty or the transport is ipc."""

    keys: KeyPair | None = None
    authorized_clients_dir: Path | None = None

    @classmethod
    def from_config(cls, config: WorkerConfig) -> ServerSecurity:
        options = config.security
        if not is_configured(options):
            return cls()
        if config.runtime.transport != "tcp":
            log.warning(
                "[security] is set but runtime.transport is %r: CURVE applies to tcp only, the "
                "ipc sockets are guarded by the 0700 runtime directory",
                config.runtime.transport,
            )
            return cls()
        keys = load_key_pair(
            options.server_secret_key_file,
            "security.server_secret_key_file",
            options.server_public_key_file,
            "security.server_public_key_file",
        )
        return cls(keys, _authorized_dir(options.authorized_clients_dir))

    @property
    def is_enabled(self) -> bool:
        return self.keys is not None

    def start_authenticator(self, context: zmq.Context) -> Authenticator | None:
        """Admit only authorized client keys; start it before binding a CURVE server socket."""
        if self.authorized_clients_dir is None:
            return None
        return start_authenticator(context, _AuthorizedKeysDir(self.authorized_clients_dir))

    def server_options(self, endpoint: str) -> SocketOptions:
        """The task PULL and admin ROUTER: CURVE servers with the deployment's key pair."""
        if self.keys is None or not uses_curve(endpoint):
            return {}
        return _curve_server(self.keys)

    def result_options(self, endpoint: str, client_key: str | None) -> SocketOptions:
        """A result PUSH to `endpoint` (a client's reply_to): a CURVE client presenting the
        server's pair that talks only to the holder of `client_key`, the key its request came
        with. Raises ValueError when a request over CURVE has no such key."""
        if self.keys is None or not uses_curve(endpoint):
            return {}
        if client_key is None:
            raise ValueError(
                f"reply_to {endpoint} needs the key of an authenticated client; "
                "this request came without one"
            )
        return _curve_client(self.keys, client_key.encode("ascii"))


@dataclass(frozen=True)
class ClientSecurity:
    """A client's side (`Client`, `aioworker admin`): its key pair and the server's public key.
    Disabled (every method a no-op) when [security] is empty."""

    keys: KeyPair | None = None
    server_public_key: bytes = b""

    @classmethod
    def from_options(cls, options: SecurityOptions) -> ClientSecurity:
        if not is_configured(options):
            return cls()
        keys = load_key_pair(
            options.client_secret_key_file,
            "security.client_secret_key_file",
            options.client_public_key_file,
            "security.client_public_key_file",
        )
        server_key = load_public_key(
            options.server_public_key_file, "security.server_public_key_file"
        )
        return cls(keys, server_key)

    @classmethod
    def from_config(cls, config: WorkerConfig) -> ClientSecurity:
        """Disabled under the ipc transport, where the config names no tcp endpoint."""
        if config.runtime.transport != "tcp":
            return cls()
        return cls.from_options(config.security)

    @property
    def is_enabled(self) -> bool:
        return self.keys is not None

    def start_authenticator(self, context: zmq.Context) -> Authenticator | None:
        """Admit only the server's key at the result socket; start it before binding that."""
        if self.keys is None:
            return None
        return start_authenticator(context, _OneKey(self.server_public_key))

    def connect_options(self, endpoint: str) -> SocketOptions:
        """Sockets that connect to the driver (task PUSH, admin DEALER): CURVE clients."""
        if self.keys is None or not uses_curve(endpoint):
            return {}
        return _curve_client(self.keys, self.server_public_key)

    def result_options(self, endpoint: str) -> SocketOptions:
        """The result PULL that the driver connects to: a CURVE server with the client's pair."""
        if self.keys is None or not uses_curve(endpoint):
            return {}
        return _curve_server(self.keys)


def _curve_server(keys: KeyPair) -> SocketOptions:
    return {
        zmq.CURVE_SERVER: 1,
        zmq.CURVE_PUBLICKEY: keys.public_key,
        zmq.CURVE_SECRETKEY: keys.secret_key,
    }


def _curve_client(keys: KeyPair, server_key: bytes) -> SocketOptions:
    return {
        zmq.CURVE_SERVERKEY: server_key,
        zmq.CURVE_PUBLICKEY: keys.public_key,
        zmq.CURVE_SECRETKEY: keys.secret_key,
    }
