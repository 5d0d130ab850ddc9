"""An `aioworker` command run as a child for a test, its stderr collected line by line by a
thread (so the pipe never fills and the test can wait for a line)."""

from __future__ import annotations

import subprocess
import sys
import threading


class Process:
    def __init__(self, argv: list[str]) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-m", "aioworker.cli.main", *argv],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.lines: list[str] = []
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        for line in self.process.stderr:
            self.lines.append(line.rstrip("\n"))

    @property
    def stderr(self) -> str:
        return "\n".join(self.lines)

    @property
    def log(self) -> str:
        """The last lines, for an assertion's message."""
        return "\n".join(self.lines[-60:])

    def wait(self, timeout: float = 10.0) -> int:
        code = self.process.wait(timeout)
        self.reader.join(5)
        return code

    def stop(self) -> None:
        """SIGTERM, then SIGKILL after 30 s."""
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.reader.join(5)

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()
