"""`aioworker bench --workload chat`: a 4-turn chat on the embedded model (CPU), its history
growing each turn, with prefix caching on against off in the same run: time to first token of
each turn. Each side runs REPEATS times, alternating; the table gives medians."""

from __future__ import annotations

import statistics
import time

from aioworker.bench.gpu_prefix import set_prefix_caching
from aioworker.core.sampling_params import SamplingParams

REPEATS = 3
SYSTEM = (
    "You are a patient assistant for engineers who run inference fleets. Answer in plain words, "
    "name the setting or command that does what is asked, say what it costs, and say how to "
    "check that it worked. When a question is ambiguous, state the reading you chose. Prefer "
    "short lists to long paragraphs. Mention the failure modes an operator should watch for: "
    "memory pressure, queueing delay, stale heartbeats, lost requests and mixed weights. "
) * 3
QUESTIONS = (
    "How do I know that a worker group is ready to take traffic?",
    "And what should a load balancer do while the group drains?",
    "How large should the queue bound be for a bursty workload?",
    "Summarise what we said, as three short rules.",
)
REPLY = SamplingParams(temperature=0.0, max_tokens=48)


def first_token_s(engine, prompt: list[int]) -> tuple[float, list[int]]:
    """Seconds from submitting `prompt` to its first token, and the whole reply's tokens."""
    started = time.perf_counter()
    request_id = engine.add_request(prompt, REPLY)
    first, tokens = None, []
    while engine.has_unfinished:
        for out in engine.step():
            if out.request_id == request_id:
                first = first if first is not None else time.perf_counter() - started
                tokens += out.token_ids
    return first, tokens


def conversation(engine, cached: bool) -> list[float]:
    """Each turn's time to first token, the history (with the replies) growing."""
    set_prefix_caching(engine, cached)
    messages = [{"role": "system", "content": SYSTEM}]
    times = []
    for question in QUESTIONS:
        messages.append({"role": "user", "content": question})
        prompt = engine.tokenizer.encode_chat(messages)
        seconds, reply = first_token_s(engine, prompt)
        times.append(seconds)
        messages.append({"role": "assistant", "content": engine.tokenizer.decode(reply)})
    return times


def run(engine) -> dict[bool, list[list[float]]]:
    """cached -> one list of per-turn times per run."""
    conversation(engine, True)  # warm-up
    runs: dict[bool, list[list[float]]] = {False: [], True: []}
    for _ in range(REPEATS):
        for cached in (False, True):
            runs[cached].append(conversation(engine, cached))
    return runs


def medians(runs: list[list[float]]) -> list[float]:
    return [statistics.median(turn) for turn in zip(*runs, strict=True)]
