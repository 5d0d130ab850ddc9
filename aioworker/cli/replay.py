"""`aioworker replay FILE`: run the requests of a recording (runtime.record_path) again through
the offline engine and check that every request whose output is reproducible (greedy or
seeded, not aborted) gives the same tokens and finish reason."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field

from aioworker.cli.common import add_config_arguments, config_from_args, fail
from aioworker.config import ConfigError
from aioworker.core.outputs import Completion
from aioworker.wire.protocol import (
    RESULT_DECODER,
    TASK_DECODER,
    Outputs,
    ProtocolError,
    SubmitRequest,
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("recording", metavar="FILE", help="a file written with runtime.record_path")
    parser.add_argument("--show", type=int, default=5, metavar="N", help="list up to N mismatches")
    add_config_arguments(parser)


@dataclass
class Recorded:
    submit: SubmitRequest
    token_ids: list[int] = field(default_factory=list)
    finish_reason: str | None = None

    @property
    def reproducible(self) -> bool:
        params = self.submit.params
        deterministic = params.temperature == 0.0 or params.seed is not None
        return deterministic and self.finish_reason not in (None, "abort")


def load_recording(path: str) -> dict[str, Recorded]:
    from aioworker.runtime.recorder import read_records

    requests: dict[str, Recorded] = {}
    for record in read_records(path):
        try:
            if record.kind == "task":
                message = TASK_DECODER.decode(record.frames)
                if isinstance(message, SubmitRequest) and message.request_id not in requests:
                    requests[message.request_id] = Recorded(message)
            else:
                message = RESULT_DECODER.decode(record.frames)
        except ProtocolError:
            continue  # a malformed frame was recorded as received; it produced no request
        if isinstance(message, Outputs):
            for delta in message.outputs:
                recorded = requests.get(delta.request_id)
                if recorded is not None and recorded.finish_reason is None:
                    recorded.token_ids += delta.token_ids
                    recorded.finish_reason = delta.finish_reason
    return requests


def run(args: argparse.Namespace) -> int:
    try:
        config = config_from_args(args)
        requests = load_recording(args.recording)
    except (ConfigError, OSError) as exc:
        return fail(str(exc))
    replayable = {rid: r for rid, r in requests.items() if r.reproducible}
    from aioworker.engine import LLMEngine  # torch enters here

    with LLMEngine.from_config(config) as engine:
        for request_id, recorded in replayable.items():
            engine.add_request(recorded.submit.prompt_token_ids, recorded.submit.params, request_id)
        replayed = _drain(engine)
    mismatches = [
        rid
        for rid, recorded in replayable.items()
        if (replayed[rid].token_ids, str(replayed[rid].finish_reason))
        != (recorded.token_ids, recorded.finish_reason)
    ]
    print(
        f"{len(requests)} request(s) recorded, {len(replayable)} reproducible (greedy or seeded, "
        f"finished), {len(replayable) - len(mismatches)} identical, {len(mismatches)} different"
    )
    for rid in mismatches[: args.show]:
        print(
            f"  {rid}: recorded {replayable[rid].token_ids[:12]}... replayed {replayed[rid].token_ids[:12]}..."
        )
    return 1 if mismatches else 0


def _drain(engine) -> dict[str, Completion]:
    completions: dict[str, Completion] = {}
    for out in engine.stream():
        completions.setdefault(out.request_id, Completion(out.request_id)).add(out)
    return completions
