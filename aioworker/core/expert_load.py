"""How evenly a rank's experts are loaded: tokens routed to each of them, summed over the MoE
layers, since the rank started, and what operators read from that (admin status, `top`, the
Prometheus histogram): tokens per expert per step, and the busiest expert against the mean."""

from __future__ import annotations

from typing import NamedTuple


class ExpertLoad(NamedTuple):
    # This rank's experts, e.g. "experts 0-63 of 128 (expert parallel)".
    layout: str = ""
    # The global index of this rank's first expert.
    first_expert: int = 0
    # Tokens routed to each of this rank's experts (one count per (token, layer, choice)).
    tokens: tuple[int, ...] = ()
    # Steps counted, and the MoE layers each step passes through.
    num_steps: int = 0
    num_layers: int = 0


def tokens_per_step(load: ExpertLoad, since: ExpertLoad | None = None) -> list[float]:
    """Each expert's tokens per step per layer (since an earlier reading, where given)."""
    tokens, steps = load.tokens, load.num_steps
    if since is not None and len(since.tokens) == len(tokens):
        tokens = tuple(a - b for a, b in zip(tokens, since.tokens, strict=True))
        steps -= since.num_steps
    if steps <= 0 or not load.num_layers:
        return [0.0] * len(tokens)
    return [count / (steps * load.num_layers) for count in tokens]


def imbalance(per_expert: list[float]) -> float:
    """The busiest expert's load over the mean (1.0 when even; 0.0 with no load yet)."""
    mean = sum(per_expert) / len(per_expert) if per_expert else 0.0
    return max(per_expert) / mean if mean > 0 else 0.0


def summary(load: ExpertLoad) -> dict[str, object]:
    """The status fields of one rank's load since it started."""
    per_expert = tokens_per_step(load)
    return {
        "experts": load.layout,
        "tokens_per_expert_per_step": {
            "min": round(min(per_expert, default=0.0), 3),
            "mean": round(sum(per_expert) / max(1, len(per_expert)), 3),
            "max": round(max(per_expert, default=0.0), 3),
        },
        "imbalance": round(imbalance(per_expert), 3),
        "steps": load.num_steps,
    }
