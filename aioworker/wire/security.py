"""CURVE encryption and authentication for the tcp endpoints that clients and operators reach:
key files, the ZAP authenticator that admits only known keys, and each side's socket options.

The driver's task PULL and admin ROUTER are CURVE servers; a client presents its key pair. The
results go back over the driver's PUSH to the client's own PULL, which is a CURVE server too:
the driver connects to it with the key that the client authenticated with (the User-Id of its
task frames), so only the holder of that key's secret can receive them, and the client admits
only the driver's key. Torch-free.
"""

from __future__ import annotations

import enum
import logging
from dataclasses import dataclass
from pathlib import Path

import zmq
import zmq.asyncio
from zmq.auth.asyncio import AsyncioAuthenticator
from zmq.auth.base import Authenticator
from zmq.auth.thread import ThreadAuthenticator

from aioworker.config import SecurityOptions, WorkerConfig
from aioworker.wire.keys import (
    KeyPair,
    SecurityError,
    key_directory,
    load_key_pair,
    load_public_key,
    read_authorized_keys,
)

log = logging.getLogger(__name__)

# Socket option -> value, applied before a socket binds or connects.
SocketOptions = dict[int, int | bytes]


# The [security] settings that hold keys: any of them set turns CURVE on.
KEY_SETTINGS = (
    "server_secret_key_file",
    "server_public_key_file",
    "authorized_clients_dir",
    "admin_clients_dir",
    "client_secret_key_file",
    "client_public_key_file",
)
LOOPBACK_HOSTS = ("localhost", "::1")


class Role(enum.StrEnum):
    """Who a CURVE server socket admits (its ZAP domain)."""

    CLIENTS = "clients"  # the task socket: authorized client keys, and admin keys
    ADMIN = "admin"  # the admin socket: admin keys only
    RANKS = "ranks"  # control and acks: the deployment's own (server) key only
    BEATS = "beats"  # heartbeats: ranks, clients and admins all watch them


def is_configured(options: SecurityOptions) -> bool:
    """Any [security] key set turns CURVE on, for every role (a half-configured side fails fast)."""
    return any(getattr(options, name) for name in KEY_SETTINGS)


def uses_curve(endpoint: str) -> bool:
    """Only tcp endpoints use CURVE; ipc relies on its 0700 runtime directory."""
    return endpoint.startswith("tcp://")


def is_loopback(host: str) -> bool:
    return host in LOOPBACK_HOSTS or host.startswith("127.")


# -- the ZAP authenticator --------------------------------------------------------------------


class _KeysByRole:
    """ZAP credentials: which keys each role admits. Key directories are read at each handshake,
    so adding or removing a file needs no restart."""

    def __init__(self, server_key: bytes, clients_dir: Path, admin_dir: Path | None) -> None:
        self.server_key = server_key
        self.clients_dir = clients_dir
        self.admin_dir = admin_dir
        self._refused: set[tuple[str, bytes]] = set()

    def admits(self, role: str, key: bytes) -> bool:
        admins = read_authorized_keys(self.admin_dir) if self.admin_dir else set()
        if role == Role.ADMIN:
            return key in admins
        if role == Role.RANKS:
            return key == self.server_key
        clients = read_authorized_keys(self.clients_dir) | admins
        if role == Role.BEATS:
            return key == self.server_key or key in clients
        return role == Role.CLIENTS and key in clients

    def callback(self, domain: str, key: bytes) -> bool:
        if self.admits(domain, key):
            return True
        if (domain, key) not in self._refused and len(self._refused) < 1024:
            # A refused peer retries every 100 ms: say so once per key and role.
            self._refused.add((domain, key))
            log.warning("refused a CURVE peer on the %s sockets: key %s", domain, key.decode())
        return False


class _OneKey:
    """ZAP credentials admitting one key: the driver's, at a client's result socket."""

    def __init__(self, key: bytes) -> None:
        self.key = key

    def callback(self, domain: str, key: bytes) -> bool:
        return key == self.key


def start_authenticator(
    context: zmq.Context, credentials: object, domains: tuple[str, ...] = ("*",)
) -> Authenticator:
    """A ZAP handler for every CURVE server socket of `context` (one per context), asking
    `credentials` for the sockets of each ZAP domain: on the running loop for an asyncio context,
    else on its own thread. Without one, libzmq admits any key."""
    kind = AsyncioAuthenticator if isinstance(context, zmq.asyncio.Context) else ThreadAuthenticator
    authenticator = kind(context, log=log.getChild("zap"))
    authenticator.start()
    for domain in domains:
        authenticator.configure_curve_callback(domain=domain, credentials_provider=credentials)
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


def peer_address_of(frame: zmq.Frame) -> str | None:
    """The IP address a received tcp message came from; None for ipc."""
    try:
        return frame.get("Peer-Address") or None
    except zmq.ZMQError:
        return None


async def recv_with_client_key(sock: zmq.asyncio.Socket) -> tuple[list[bytes], str | None]:
    """One multipart message and its sender's authenticated key (see `client_key_of`)."""
    frames = await sock.recv_multipart(copy=False)
    return [frame.bytes for frame in frames], client_key_of(frames[-1])


# -- the two sides ----------------------------------------------------------------------------


@dataclass(frozen=True)
class ServerSecurity:
    """A rank's side: the deployment's key pair and the directories of admitted keys. Disabled
    (every method a no-op) when [security] is empty or the transport is ipc."""

    keys: KeyPair | None = None
    clients_dir: Path | None = None
    admin_dir: Path | None = None

    @classmethod
    def from_config(cls, config: WorkerConfig) -> ServerSecurity:
        """Raises SecurityError for a bad key file or directory, and for tcp on an address other
        machines reach with no keys at all (unless security.allow_insecure)."""
        options = config.security
        if not is_configured(options):
            _check_insecure_tcp(config)
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
        return cls(keys, *_key_directories(options))

    @property
    def is_enabled(self) -> bool:
        return self.keys is not None

    def start_authenticator(self, context: zmq.Context) -> Authenticator | None:
        """Admit each role's keys; start it before binding a CURVE server socket."""
        if self.keys is None:
            return None
        credentials = _KeysByRole(self.keys.public_key, self.clients_dir, self.admin_dir)
        return start_authenticator(context, credentials, tuple(role.value for role in Role))

    def server_options(self, endpoint: str, role: Role = Role.CLIENTS) -> SocketOptions:
        """A socket this rank binds: a CURVE server with the deployment's pair, admitting the
        keys of `role`."""
        if self.keys is None or not uses_curve(endpoint):
            return {}
        return {**_curve_server(self.keys), zmq.ZAP_DOMAIN: role.value.encode()}

    def rank_options(self, endpoint: str) -> SocketOptions:
        """A socket this rank connects to another rank's (control, acks, heartbeats): a CURVE
        client presenting the deployment's own pair."""
        if self.keys is None or not uses_curve(endpoint):
            return {}
        return _curve_client(self.keys, self.keys.public_key)

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


def _key_directories(options: SecurityOptions) -> tuple[Path, Path | None]:
    setting = "security.authorized_clients_dir"
    if not options.authorized_clients_dir:
        raise SecurityError(
            f"{setting} is empty, but [security] is configured; give the directory of the "
            "clients' public .key files"
        )
    clients = key_directory(options.authorized_clients_dir, setting, "client")
    if not options.admin_clients_dir:
        log.warning(
            "security.admin_clients_dir is empty: admin commands over tcp are refused; "
            "`aioworker keys DIR` writes an admin key pair and its directory"
        )
        return clients, None
    admins = key_directory(options.admin_clients_dir, "security.admin_clients_dir", "admin")
    return clients, admins


def _check_insecure_tcp(config: WorkerConfig) -> None:
    runtime = config.runtime
    if runtime.transport != "tcp":
        return
    exposed = sorted({h for h in [runtime.host, *runtime.rank_hosts] if h and not is_loopback(h)})
    if not exposed:
        return
    if not config.security.allow_insecure:
        raise SecurityError(
            f"runtime.transport is tcp on {', '.join(exposed)}, which other machines reach, and "
            "[security] has no keys: anyone who reaches the ports could read every prompt and "
            "control the workers. Write keys with `aioworker keys DIR` and add the [security] "
            "lines it prints, or set security.allow_insecure = true to accept this"
        )
    log.warning(
        "INSECURE: tcp on %s with no CURVE keys (security.allow_insecure = true): prompts and "
        "outputs travel in the clear, and anyone who reaches the ports controls the workers",
        ", ".join(exposed),
    )


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
        """Sockets that connect to a rank (task PUSH, admin DEALER, heartbeat SUB): CURVE
        clients."""
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
