"""How many drafts each sequence may verify this step: measured, not guessed.

Verifying k drafts turns a sequence's one-token step into k + 1 tokens. If a sequence gets
drafts at all with probability r (the proposer finds none for much text) and each draft is
accepted with probability a (given the ones before it were), a step yields
r (1 - a^(k+1)) / (1 - a) + (1 - r) tokens per sequence instead of one. It costs
(T(n) + r (T(n + B k) - T(n)) + h) / T(n) as much, where T is the measured time of a step of that many tokens
(`StepCosts`), n the step's tokens without drafts, B the sequences that may speculate, and h
the host's time between steps, which drafts expose (a step with drafts cannot be scheduled
before the previous one's tokens are known; without them the host works while the device
runs). The policy takes the k with the best ratio of the two, and k = 0 (no drafts, and the
engine runs a step ahead again) where none beats 1 by MIN_GAIN: at small batches verification
is nearly free; at large ones a step is bound by arithmetic and drafts only cost.

A step size with nothing measured at or above it is tried once (its cost taken as 1), so the
policy learns the cost of every k it may choose; one between measured sizes is interpolated.
r and a start at priors and follow what the proposer and verification report. While k is 0
nothing reports r, so every PROBE_INTERVAL decisions one step proposes anyway, where drafts
could pay at all (were every sequence given drafts, accepted at the prior rate): new
copy-heavy requests are noticed within a few steps, at the cost of one exposed host gap per
interval. Where they could not (large batches, whose verify steps cost several decode steps
and run past the verify graphs), probing would only cost, and it does not probe.
"""

from __future__ import annotations

from aioworker.core.speculation.step_costs import StepCosts

PRIOR_ACCEPTANCE = 0.7
PRIOR_PROPOSAL_RATE = 1.0
_WEIGHT = 0.05  # how fast measured rates take over from the priors, per sequence observed
MIN_GAIN = 1.05
PROBE_INTERVAL = 32
# Decisions are kept per (tokens, sequences and the rates they used) and made again after this
# many step measurements: a decision weighs every k against the step costs, and the engine asks
# for one twice a step.
REDECIDE_EVERY = 16


class SpeculationPolicy:
    def __init__(
        self, max_tokens: int, dynamic: bool = True, max_step_tokens: int | None = None
    ) -> None:
        """`max_step_tokens`: the step's token budget; no k may take a step past it."""
        self.max_tokens = max_tokens
        self.dynamic = dynamic
        self.max_step_tokens = max_step_tokens
        self.costs = StepCosts()
        self.acceptance = PRIOR_ACCEPTANCE
        self.proposal_rate = PRIOR_PROPOSAL_RATE
        self.host_gap_s = 0.0
        self._since_probe = 0
        self._decisions: dict[tuple, int] = {}
        self._measurements = 0
        # Totals for reports: drafts proposed and accepted, sequences verified (one per sequence
        # per step with drafts).
        self.num_proposed = 0
        self.num_accepted = 0
        self.num_verified = 0

    # -- decisions ----------------------------------------------------------------------------

    def num_draft_tokens(self, num_tokens: int, num_seqs: int, probe: bool = False) -> int:
        """Drafts per sequence for a step of `num_tokens` tokens without drafts, `num_seqs` of
        whose sequences may speculate. `probe`: count this decision toward the next probe."""
        largest = self._largest_k(num_tokens, num_seqs)
        if largest <= 0:
            return 0
        if not self.dynamic:
            return largest
        k = self.best(num_tokens, num_seqs)
        if k == 0 and probe and self._could_pay(num_tokens, num_seqs, largest):
            self._since_probe += 1
            if self._since_probe >= PROBE_INTERVAL:
                self._since_probe = 0
                return largest
        return k

    def _could_pay(self, num_tokens: int, num_seqs: int, k: int) -> bool:
        """Whether k drafts would pay if every sequence had them, accepted at the prior rate:
        where even that would not (a verify step costs too much), probing only costs."""
        return self.gain(num_tokens, num_seqs, k, acceptance=PRIOR_ACCEPTANCE, rate=1.0) > 0

    def _largest_k(self, num_tokens: int, num_seqs: int) -> int:
        """The most drafts per sequence that keep every sequence in the step's budget."""
        if num_seqs <= 0:
            return 0
        if self.max_step_tokens is None:
            return self.max_tokens
        return max(0, min(self.max_tokens, (self.max_step_tokens - num_tokens) // num_seqs))

    @property
    def probe_due(self) -> bool:
        """Whether the next decision that counts toward probes will probe."""
        return self.dynamic and self._since_probe >= PROBE_INTERVAL - 1

    def best(self, num_tokens: int, num_seqs: int) -> int:
        key = (num_tokens, num_seqs, self.acceptance, self.proposal_rate, self.host_gap_s)
        k = self._decisions.get(key)
        if k is None:
            if len(self._decisions) > 256:
                self._decisions.clear()
            largest = self._largest_k(num_tokens, num_seqs)
            k = max(range(largest + 1), key=lambda k: self.gain(num_tokens, num_seqs, k))
            self._decisions[key] = k
        return k

    def _measured_step(self, new_bucket: bool) -> None:
        self._measurements += 1
        if new_bucket or self._measurements % REDECIDE_EVERY == 0:
            self._decisions.clear()

    def gain(
        self,
        num_tokens: int,
        num_seqs: int,
        k: int,
        acceptance: float | None = None,
        rate: float | None = None,
    ) -> float:
        """Expected tokens per second with k drafts per sequence, over none (1 for k = 0;
        0 where k would not pay MIN_GAIN); `acceptance` and `rate` default to the measured."""
        if k == 0:
            return 1.0
        rate = self.proposal_rate if rate is None else rate
        acceptance = self.acceptance if acceptance is None else acceptance
        with_drafts = num_tokens + num_seqs * k
        base, longer = self.costs.seconds(num_tokens), self.costs.seconds(with_drafts)
        if base is None or longer is None:
            # Nothing measured at or past it: try it, once. (A size between measured ones is
            # interpolated: with few proposals the steps run are smaller than this one, so
            # "until measured" could mean forever.)
            cost = 1.0
        else:
            # Each sequence has drafts with probability `rate`: the cost in between, linearly.
            cost = (base + rate * (longer - base) + self.host_gap_s) / base
        gain = (rate * expected_tokens(acceptance, k) + 1.0 - rate) / cost
        return gain if gain >= MIN_GAIN else 0.0

    # -- measurements -------------------------------------------------------------------------

    def observe_step(self, num_tokens: int, seconds: float) -> None:
        new_bucket = not self.costs.knows(num_tokens)
        self.costs.observe(num_tokens, seconds)
        self._measured_step(new_bucket)

    def observe_host_gap(self, seconds: float) -> None:
        """The host's time between a step's completion and the next step's submission, where
        the next step waited for it."""
        self.host_gap_s += 0.2 * (seconds - self.host_gap_s)

    def observe_proposals(self, num_asked: int, num_given: int) -> None:
        """The proposer was asked for drafts for `num_asked` sequences and gave `num_given`."""
        if num_asked > 0:
            weight = min(1.0, _WEIGHT * num_asked)
            self.proposal_rate += weight * (num_given / num_asked - self.proposal_rate)

    def observe_verified(self, num_proposed: int, num_accepted: int, num_seqs: int) -> None:
        """A step verified `num_seqs` sequences' `num_proposed` drafts, `num_accepted` kept."""
        if num_proposed <= 0:
            return
        self.num_proposed += num_proposed
        self.num_accepted += num_accepted
        self.num_verified += num_seqs
        weight = min(1.0, _WEIGHT * num_proposed)
        self.acceptance += weight * (num_accepted / num_proposed - self.acceptance)

    def table(self, batch_sizes: tuple[int, ...] = (1, 4, 16, 64, 256)) -> list[dict]:
        """What the policy would choose now for decode batches of these sizes, and why."""
        rows = []
        for batch in batch_sizes:
            k = self.best(batch, batch)
            base = self.costs.seconds(batch)
            rows.append(
                {
                    "batch": batch,
                    "k": k,
                    "step_ms": None if base is None else round(base * 1e3, 2),
                    "gain": round(self.gain(batch, batch, k), 3),
                    "acceptance": round(self.acceptance, 3),
                    "proposal_rate": round(self.proposal_rate, 3),
                }
            )
        return rows


def expected_tokens(acceptance: float, k: int) -> float:
    """Tokens a step yields per sequence with k drafts, each accepted with this probability."""
    if acceptance >= 1.0:
        return k + 1.0
    return (1.0 - acceptance ** (k + 1)) / (1.0 - acceptance)
