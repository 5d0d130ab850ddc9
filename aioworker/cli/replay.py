"""`aioworker replay FILE`: run the requests of a recording (runtime.record_path) again through
the offline engine and check that every request whose output is reproducible (greedy or seeded
and finished, or refused) ends the same: the same tokens and finish reason, or the same refusal."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from aioworker.cli.common import add_config_arguments, config_from_args, fail
from aioworker.config import ConfigError
from aioworker.core.outputs import Completion, FinishReason
from aioworker.core.sampling_params import InvalidRequestError
from aioworker.wire.protocol import (
    RESULT_DECODER,
    TASK_DECODER,
    Outputs,
    ProtocolError,
    SubmitRequest,
)

if TYPE_CHECKING:
    from aioworker.engine import LLMEngine

# Tokens of each side shown for a request whose tokens differ.
SHOWN_TOKENS = 12


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "recording",
        metavar="FILE",
        help="a file written with runtime.record_path; give the recorded worker's model and "
        "settings (--dtype among them: 'auto' may pick another dtype on another processor), or "
        "tokens may differ for rounding alone",
    )
    parser.add_argument("--show", type=int, default=5, metavar="N", help="list up to N mismatches")
    add_config_arguments(parser)


@dataclass
class Recorded:
    submit: SubmitRequest
    token_ids: list[int] = field(default_factory=list)
    finish_reason: str | None = None
    error: str | None = None

    @property
    def was_refused(self) -> bool:
        return self.finish_reason == FinishReason.ERROR

    @property
    def reproducible(self) -> bool:
        # Whether a request is refused does not depend on sampling: replay every refusal.
        if self.was_refused:
            return True
        params = self.submit.params
        deterministic = params.is_greedy or params.seed is not None
        return deterministic and self.finish_reason not in (None, FinishReason.ABORT)


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
                    recorded.error = delta.error
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
        replayed = replay(engine, replayable)
    mismatches = {rid: mismatch(r, replayed[rid]) for rid, r in replayable.items()}
    mismatches = {rid: why for rid, why in mismatches.items() if why is not None}
    print(
        f"{len(requests)} request(s) recorded, {len(replayable)} reproducible (greedy or seeded "
        f"and finished, or refused), {len(replayable) - len(mismatches)} identical, "
        f"{len(mismatches)} different"
    )
    for rid, why in list(mismatches.items())[: args.show]:
        print(f"  {rid}: {why}")
    return 1 if mismatches else 0


def replay(engine: LLMEngine, requests: dict[str, Recorded]) -> dict[str, Completion]:
    """Every request's outcome on the engine; one it refuses ends with ERROR and the reason."""
    completions: dict[str, Completion] = {}
    for request_id, recorded in requests.items():
        try:
            engine.add_request(recorded.submit.prompt_token_ids, recorded.submit.params, request_id)
        except InvalidRequestError as exc:
            completions[request_id] = Completion(
                request_id, finish_reason=FinishReason.ERROR, error=str(exc)
            )
    for out in engine.stream():
        completions.setdefault(out.request_id, Completion(out.request_id)).add(out)
    return completions


def mismatch(recorded: Recorded, replayed: Completion) -> str | None:
    """How the replayed request differs from the recording, in words; None if it does not."""
    replay_refused = replayed.finish_reason == FinishReason.ERROR
    if recorded.was_refused and replay_refused:
        # A refusal recorded without a reason matches any refusal.
        if recorded.error and replayed.error != recorded.error:
            return f"refused with {replayed.error!r}; recorded refused with {recorded.error!r}"
        return None
    if recorded.was_refused:
        return (
            f"accepted ({len(replayed.token_ids)} tokens, {replayed.finish_reason}); "
            f"recorded refused with {recorded.error!r}"
        )
    if replay_refused:
        return (
            f"refused with {replayed.error!r}; recorded {len(recorded.token_ids)} tokens, "
            f"{recorded.finish_reason}"
        )
    same_tokens = replayed.token_ids == recorded.token_ids
    if same_tokens and str(replayed.finish_reason) == recorded.finish_reason:
        return None
    return (
        f"recorded {recorded.token_ids[:SHOWN_TOKENS]}... "
        f"replayed {replayed.token_ids[:SHOWN_TOKENS]}..."
    )
