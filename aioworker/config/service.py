"""The sections of how the ranks run and are reached: the runtime (sockets, heartbeats, limits),
the launcher's restarts, CURVE security and the HTTP API server."""

from __future__ import annotations

import math
from typing import Literal

from aioworker.config.section import ConfigError, Section, check_positive


class RuntimeOptions(Section):
    # Deployment name: namespaces endpoints so several deployments can share a host.
    name: str = "aioworker"
    # ipc: sockets in `runtime_dir` (one host). tcp: `host` and ports from `base_port`.
    transport: Literal["ipc", "tcp"] = "ipc"
    # "" = $XDG_RUNTIME_DIR/aioworker, else /tmp/aioworker-<uid>; created 0700.
    runtime_dir: str = ""
    # tcp: the address every rank binds and connects, unless rank_hosts names one per rank.
    host: str = "127.0.0.1"
    # tcp across hosts: the address of each global rank (rank R at rank_hosts[R]); a group's
    # sockets live on its driver's address, each rank's heartbeat on its own.
    rank_hosts: list[str] = []
    # Below Linux's ephemeral range (32768-60999 by default): a port there can be held by any
    # outgoing connection's local end, and a restarting rank would then fail to bind.
    base_port: int = 27000
    heartbeat_interval_s: float = 1.0
    # Send-queue bound per result socket; past it, outputs wait in the client's outbox.
    result_hwm: int = 10000
    # A client that lives but takes none of its outputs for this long is given up: its
    # requests are aborted and their KV blocks freed. (One whose process is gone is given up
    # about a second after its outputs stop leaving.)
    client_timeout_s: float = 60.0
    # Result sockets kept open (one per client); the least recently used idle one makes room.
    max_client_sockets: int = 256
    # The largest message a socket accepts (ZMQ_MAXMSGSIZE): a peer that sends more is
    # disconnected before anything is read. The admin socket's bound is separate: pushed
    # weights travel there, one tensor per frame.
    max_message_bytes: int = 64 << 20
    max_admin_message_bytes: int = 8 << 30
    log_format: Literal["text", "json"] = "text"
    # SIGTERM / `admin drain`: in-flight requests get this long before the rest are aborted.
    drain_timeout_s: float = 60.0
    # A step in flight with no progress for this long is a hung step: dump stacks, exit. 0 = off.
    hung_step_timeout_s: float = 300.0
    # Prometheus metrics over HTTP on this port (driver ranks; peers add their rank). 0 = off.
    metrics_port: int = 0
    # Record every task-channel frame and every output to this file (see `aioworker replay`).
    record_path: str = ""
    # While memory is released (`admin release-memory`): queue new requests, or refuse them.
    while_released: Literal["queue", "reject"] = "queue"


class LauncherOptions(Section):
    """How `aioworker serve` supervises its children. A data-parallel group whose rank crashes
    (exits non-zero or is killed) is restarted, all its ranks together, while the other groups
    serve on; so is a crashed API server. A clean exit (`admin shutdown`, `admin drain`) is not
    restarted."""

    # The first restart waits this long; each further one within the window twice as long, up to
    # max_restart_backoff_s.
    restart_backoff_s: float = 1.0
    max_restart_backoff_s: float = 30.0
    # A group (or the API server) that crashes again after this many restarts within
    # restart_window_s is crash-looping: the launcher stops everything and exits non-zero.
    # 0: no restarts (one crash stops the deployment).
    max_restarts: int = 5
    restart_window_s: float = 300.0


class SecurityOptions(Section):
    """CURVE encryption and authentication for tcp endpoints (keys as written by
    `aioworker keys`, the z85 text format of zmq.auth). Empty = no CURVE."""

    # This deployment's server key pair: the secret file must not be readable by others.
    server_secret_key_file: str = ""
    server_public_key_file: str = ""
    # Directory of *.key public key files of the clients allowed in (requests, heartbeats).
    authorized_clients_dir: str = ""
    # Directory of *.key public key files allowed to send admin commands (and what clients
    # may). Empty: admin commands over tcp are refused.
    admin_clients_dir: str = ""
    # What a client (aioworker generate/admin, the client library) presents.
    client_secret_key_file: str = ""
    client_public_key_file: str = ""
    # Hosts a request's reply_to may name over tcp; empty: only the address its request came
    # from. The worker never connects where no client asked from.
    reply_hosts: list[str] = []
    # tcp on an address other machines reach, with no keys above: refused unless this is true.
    allow_insecure: bool = False


class ApiOptions(Section):
    """The OpenAI-compatible HTTP server (`aioworker api`, or `serve --api-port`)."""

    # Without api_key the HTTP server has no authentication: keep it on loopback, or behind a
    # proxy that has.
    host: str = "127.0.0.1"
    # 0: any free port (the server prints the one it got).
    port: int = 8000
    # The names clients give as `model`: one, or a list whose first is the one answers carry;
    # empty: the last part of model.path.
    served_model_name: str | list[str] = ""
    # Bearer token every route but /health asks for; empty: none (AIOWORKER_API_KEY also sets it).
    api_key: str = ""
    # A Jinja chat template file used instead of the model's.
    chat_template: str = ""
    # The Retry-After header (seconds) of a 429, when a group's queue is full.
    retry_after_s: int = 1
    # Each request's deadline in the workers (they abort it then); 0: none.
    request_timeout_s: float = 600.0
    # On SIGTERM, open HTTP requests get this long to finish before they are aborted.
    shutdown_timeout_s: float = 30.0
    # One log line per HTTP request (uvicorn's access log).
    access_log: bool = False
    # The largest request body (413 past it). 32 MiB holds a 128K-token prompt in any form: as
    # token ids (under 1 MiB) or as text of the most JSON-costly token (10 MiB for SmolLM2).
    max_body_bytes: int = 32 << 20
    # Threads that tokenize (and render chat templates) off the event loop.
    tokenizer_threads: int = 2
    # A connection that has not sent a whole request head this long after it opened (or after
    # its previous answer) is closed.
    header_timeout_s: float = 10.0
    # A body that has not fully arrived this long after its head is answered 408.
    body_timeout_s: float = 60.0
    # An idle keep-alive connection is closed after this long.
    keep_alive_timeout_s: float = 5.0
    # A request head (request line and headers) over this many bytes, or with more headers than
    # max_headers, is answered 431.
    max_header_bytes: int = 65536
    max_headers: int = 100
    # Open connections beyond this many are answered 503 and closed.
    max_connections: int = 4096

    def __post_init__(self) -> None:
        counts = ("max_body_bytes", "tokenizer_threads", "max_header_bytes", "max_headers")
        for name in (*counts, "max_connections"):
            check_positive(f"api.{name}", getattr(self, name))
        for name in ("header_timeout_s", "body_timeout_s", "keep_alive_timeout_s"):
            value = getattr(self, name)
            if not 0 < value < math.inf:
                raise ConfigError(f"api.{name} is {value}; give seconds > 0")
        if not all(self.served_model_names):
            raise ConfigError("api.served_model_name holds an empty name; give names, or none")

    @property
    def served_model_names(self) -> tuple[str, ...]:
        """The names as given (empty when none was: the gateway then names the model's path)."""
        names = self.served_model_name
        if isinstance(names, str):
            return (names,) if names else ()
        return tuple(names)
