"""A stand-in trainer process: puts a checkpoint's tensors on the GPU and hands them to a
running worker through CUDA IPC handles (no disk), then prints the admin reply as JSON.

    python -m tests.ipc_trainer CHECKPOINT_DIR RUNTIME_NAME [VERSION]
"""

from __future__ import annotations

import json
import sys

from aioworker.compute.loader import checkpoint_files, iterate_checkpoint
from aioworker.compute.weights.ipc import describe
from aioworker.config import load_config
from aioworker.wire.admin_client import send
from aioworker.wire.protocol import AdminRequest


def main(checkpoint: str, runtime_name: str, version: int) -> None:
    tensors = {name: t.cuda() for name, t in iterate_checkpoint(checkpoint_files(checkpoint))}
    config = load_config(overrides={"runtime.name": runtime_name})
    ipc = [describe(name, tensor) for name, tensor in tensors.items()]
    request = AdminRequest(command="update-weights", version=version, ipc_tensors=ipc, mode="keep")
    # The tensors stay alive (referenced here) until the worker has answered.
    reply = send(config, 0, request, 600).reply
    print(
        json.dumps({"ok": reply.ok, "message": reply.message, "seconds": reply.data.get("seconds")})
    )


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]) if len(sys.argv) > 3 else 7)
