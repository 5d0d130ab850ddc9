"""Baselines for the control-plane benchmark: a process that answers each task frame with one
result frame, either waiting on the socket (`event`, the floor of any ZeroMQ request path) or
polling it with a 1 ms sleep when idle (`poll`, the classic worker loop aioworker replaces).

    python -m aioworker.bench.echo_server event|poll TASK_ENDPOINT
"""

from __future__ import annotations

import sys
import time

import msgspec
import zmq

from aioworker.core.outputs import FinishReason, RequestOutput
from aioworker.wire.protocol import TASK_DECODER, Outputs, encode


def serve(mode: str, task_endpoint: str) -> None:
    context = zmq.Context()
    tasks = context.socket(zmq.PULL)
    tasks.bind(task_endpoint)
    replies: dict[str, zmq.Socket] = {}
    print("ready", flush=True)
    while True:
        if mode == "poll":
            try:
                frames = tasks.recv_multipart(flags=zmq.NOBLOCK)
            except zmq.Again:
                time.sleep(0.001)
                continue
        else:
            frames = tasks.recv_multipart()
        request = TASK_DECODER.decode(frames)
        sock = replies.get(request.reply_to)
        if sock is None:
            sock = replies[request.reply_to] = context.socket(zmq.PUSH)
            sock.connect(request.reply_to)
        output = RequestOutput(request.request_id, [1], FinishReason.LENGTH)
        sock.send_multipart(encode(Outputs(group=0, outputs=[output])))


if __name__ == "__main__":
    try:
        serve(sys.argv[1], sys.argv[2])
    except (KeyboardInterrupt, msgspec.DecodeError):
        pass
