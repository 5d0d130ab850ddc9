"""systemd's notify protocol, by hand: KEY=VALUE lines in one datagram to $NOTIFY_SOCKET, so a
Type=notify unit knows when its rank is ready, what it is doing, and that it is still alive.
Outside systemd (no NOTIFY_SOCKET) every call does nothing."""

from __future__ import annotations

import asyncio
import logging
import os
import socket
from collections.abc import Callable, Mapping

log = logging.getLogger(__name__)


class SystemdNotifier:
    """Reads NOTIFY_SOCKET, WATCHDOG_USEC and WATCHDOG_PID once; sending never raises."""

    def __init__(self, environ: Mapping[str, str] | None = None) -> None:
        environ = os.environ if environ is None else environ
        self.address = socket_address(environ.get("NOTIFY_SOCKET", ""))
        self.watchdog_interval_s = watchdog_interval_s(environ)

    @property
    def is_enabled(self) -> bool:
        return self.address is not None

    def send(self, *lines: str) -> bool:
        """One datagram of newline-separated lines; False when it was not sent."""
        if self.address is None or not lines:
            return False
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
                sock.sendto("\n".join(lines).encode(), self.address)
        except OSError as exc:
            log.debug("could not notify systemd at %r: %s", self.address, exc)
            return False
        return True

    def ready(self, status: str = "") -> bool:
        return self.send("READY=1", *status_lines(status))

    def stopping(self, status: str = "") -> bool:
        return self.send("STOPPING=1", *status_lines(status))

    def status(self, text: str) -> bool:
        return self.send(*status_lines(text))

    def extend_timeout(self, seconds: float) -> bool:
        return self.send(f"EXTEND_TIMEOUT_USEC={round(seconds * 1e6)}")

    def watchdog(self) -> bool:
        return self.send("WATCHDOG=1")


def socket_address(value: str) -> str | None:
    """A filesystem path, or '@name' for the abstract namespace (a leading NUL byte)."""
    if value.startswith("/"):
        return value
    if value.startswith("@") and len(value) > 1:
        return "\0" + value[1:]
    if value:
        log.debug("ignoring NOTIFY_SOCKET=%r: not a path or an abstract socket", value)
    return None


def watchdog_interval_s(environ: Mapping[str, str]) -> float | None:
    """WATCHDOG_USEC in seconds, when the watchdog is meant for this process."""
    pid = environ.get("WATCHDOG_PID", "")
    try:
        usec = int(environ.get("WATCHDOG_USEC", "0"))
        if pid and int(pid) != os.getpid():
            return None
    except ValueError:
        return None
    return usec / 1e6 if usec > 0 else None


def status_lines(text: str) -> list[str]:
    # One STATUS line: a newline in the text (a failure reason) would start a bogus field.
    return [f"STATUS={' '.join(text.split())}"] if text else []


async def extend_start_timeout(
    notifier: SystemdNotifier,
    is_starting: Callable[[], bool],
    every_s: float = 10.0,
    by_s: float = 30.0,
) -> None:
    """While start-up lasts, keep pushing systemd's start time-out `by_s` ahead."""
    while is_starting():
        notifier.extend_timeout(by_s)
        await asyncio.sleep(every_s)


async def feed_watchdog(
    notifier: SystemdNotifier, interval_s: float, is_healthy: Callable[[], bool]
) -> None:
    """WATCHDOG=1 every `interval_s` while `is_healthy()`; a skipped ping lets systemd act."""
    while True:
        if is_healthy():
            notifier.watchdog()
        await asyncio.sleep(interval_s)
