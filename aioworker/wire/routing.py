"""Where a client sends a request: the group to pick among several, and why a group cannot take
one at all. Torch-free; the client holds the state (beats, requests in flight) and asks."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence

from aioworker.core.outputs import ErrorKind
from aioworker.wire.group_watch import GroupWatch
from aioworker.wire.health import FINAL_STATES, MISSING, RankState


def pick_group(
    states: Sequence[str],
    lost: Sequence[bool],
    in_flight: Sequence[int],
    takes_requests: Callable[[str], bool],
    turns: Iterator[int],
) -> int:
    """The group with the fewest requests in flight (ties in `turns`, a cycle over the groups)
    among the first of: READY groups; groups that queue requests (paused, updating weights);
    groups that beat, whatever their state (their refusal says why, and their state may be
    newer than the last beat); every group (a lost one ends the request at once)."""
    alive = [
        g
        for g, state in enumerate(states)
        if not lost[g] and state != MISSING and state not in FINAL_STATES
    ]
    ready = [g for g in alive if states[g] == RankState.READY]
    queuing = [g for g in alive if takes_requests(states[g])]
    candidates = ready or queuing or alive or range(len(in_flight))
    fewest = min(in_flight[g] for g in candidates)
    while True:
        group = next(turns)
        if group in candidates and in_flight[group] == fewest:
            return group


def refusal(
    watch: GroupWatch, group: int, num_prompt_tokens: int, num_bytes: int, max_message_bytes: int
) -> tuple[str, ErrorKind] | None:
    """Why the request cannot be sent to `group` at all, or None. The prompt's length is
    checked against the max_model_len the group's driver beats (unknown before its first beat:
    the group then refuses a long prompt itself)."""
    max_model_len = watch.max_model_lens[group]
    if max_model_len and num_prompt_tokens > max_model_len:
        reason = f"prompt has {num_prompt_tokens} tokens; max_model_len is {max_model_len}"
        return reason, ErrorKind.INVALID
    if num_bytes > max_message_bytes:
        return (
            f"request of {num_bytes} bytes exceeds runtime.max_message_bytes "
            f"({max_message_bytes}); shorten the prompt or the sampling parameters",
            ErrorKind.INVALID,
        )
    if watch.is_lost[group]:
        return f"group {group} is lost: no heartbeat; request not sent", ErrorKind.UNAVAILABLE
    return None
