"""The logit controls (compute/sampling/controls.py and its kinds) against transformers' processors, or a
plain-Python reference for presence/frequency, on random logits, in batches where other rows use
no control; their device state across steps and re-admission; and the sampler's order."""

from __future__ import annotations

import random

import pytest
import torch
from transformers.generation.logits_process import (
    MinPLogitsWarper,
    NoBadWordsLogitsProcessor,
    PrefixConstrainedLogitsProcessor,
    RepetitionPenaltyLogitsProcessor,
    SequenceBiasLogitsProcessor,
)

from aioworker.compute.sampling.controls import SamplingControls
from aioworker.compute.sampling.sampler import Sampler, SampleRow
from aioworker.core.plan import LogitControls, NewSeq, SamplingSettings

VOCAB = 96
DEVICE = torch.device("cpu")


def settings(temperature: float = 0.0, logprobs: int = -1, **controls) -> SamplingSettings:
    control = LogitControls(**controls) if controls else None
    return SamplingSettings(temperature, 0, 1.0, None, 0, [], logprobs, -1, control)


def new_seq(seq_id: int, prompt: list[int], outputs: list[int] = (), **controls) -> NewSeq:
    return NewSeq(seq_id, len(prompt), settings(**controls), [*prompt, *outputs])


def random_logits(num_rows: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(num_rows, VOCAB, generator=torch.Generator().manual_seed(seed)) * 4


def random_ids(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(VOCAB) for _ in range(n)]


def output_ids(outputs: list[int]) -> torch.Tensor:
    """[1, n] token ids (n may be 0), as transformers' processors take them."""
    return torch.tensor(outputs, dtype=torch.long).reshape(1, -1)


def processed(state: SamplingControls, seq_ids: list[int], logits: torch.Tensor) -> torch.Tensor:
    """The logits after process_logits for a batch whose row i is sequence seq_ids[i]."""
    out = logits.clone()
    step = state.for_step(seq_ids)
    if step is not None:
        step.process_logits(out)
    return out


def admitted(*seqs: NewSeq) -> SamplingControls:
    state = SamplingControls(DEVICE, VOCAB)
    for seq in seqs:
        state.admit(seq)
    return state


def check_batch(state, controlled: dict[int, torch.Tensor], num_rows: int, seed: int = 0) -> None:
    """Rows 0, 2, 4...: the controlled sequences (their expected logits given as functions of
    the input row); odd rows: sequences with no control, which must come out untouched."""
    logits = random_logits(num_rows, seed)
    seq_ids = [row if row in controlled else 1000 + row for row in range(num_rows)]
    got = processed(state, seq_ids, logits)
    for row in range(num_rows):
        if row in controlled:
            expected = controlled[row](logits[row : row + 1])[0]
            torch.testing.assert_close(got[row], expected, rtol=1e-6, atol=1e-6)
        else:
            assert torch.equal(got[row], logits[row])


def test_repetition_penalty_matches_transformers_over_prompt_and_output() -> None:
    rng = random.Random(1)
    seqs = {
        row: (random_ids(rng, 12), random_ids(rng, 6), penalty)
        for row, penalty in ((0, 1.3), (2, 0.7), (4, 2.0))
    }
    state = admitted(*(new_seq(r, p, o, repetition_penalty=pen) for r, (p, o, pen) in seqs.items()))

    def reference(prompt, outputs, penalty):
        ids = torch.tensor([prompt + outputs])
        return lambda scores: RepetitionPenaltyLogitsProcessor(penalty)(ids, scores)

    check_batch(state, {r: reference(*s) for r, s in seqs.items()}, num_rows=6)


def test_presence_and_frequency_follow_openai_over_outputs_only() -> None:
    rng = random.Random(2)
    prompt, outputs = random_ids(rng, 10), random_ids(rng, 20)
    state = admitted(
        new_seq(0, prompt, outputs, presence_penalty=0.5, frequency_penalty=0.3),
        new_seq(2, prompt, outputs, presence_penalty=-1.0, frequency_penalty=2.0),
    )

    def reference(presence: float, frequency: float):
        def apply(scores: torch.Tensor) -> torch.Tensor:
            row = scores[0].tolist()
            for token in set(outputs):
                count = outputs.count(token)
                row[token] -= presence * (count > 0) + frequency * count
            return torch.tensor([row])

        return apply

    check_batch(state, {0: reference(0.5, 0.3), 2: reference(-1.0, 2.0)}, num_rows=4)
    # A prompt token that is not an output is not penalised.
    only_prompt = next(t for t in prompt if t not in outputs)
    logits = random_logits(3)
    assert processed(state, [0, 1, 2], logits)[0, only_prompt] == logits[0, only_prompt]


def test_logit_bias_matches_sequence_bias_with_one_token_sequences() -> None:
    bias = {3: 5.0, 17: -100.0, 95: 0.25, 40: 100.0}
    state = admitted(new_seq(2, [1, 2], logit_bias=bias))
    reference = SequenceBiasLogitsProcessor([[[token], value] for token, value in bias.items()])
    ids = torch.tensor([[1, 2]])
    check_batch(state, {2: lambda scores: reference(ids, scores)}, num_rows=5)


def test_allowed_token_ids_mask_every_other_token() -> None:
    allowed = [0, 5, 6, 50, 95]
    state = admitted(new_seq(0, [9], allowed_token_ids=allowed))
    reference = PrefixConstrainedLogitsProcessor(lambda batch_id, ids: allowed, num_beams=1)
    ids = torch.tensor([[9]])
    check_batch(state, {0: lambda scores: reference(ids, scores)}, num_rows=3)
    out = processed(state, [0], random_logits(1))
    assert torch.isfinite(out[0]).nonzero().flatten().tolist() == allowed


def test_bad_words_match_transformers_where_the_output_ends_with_their_prefix() -> None:
    words = [[7], [10, 11], [20, 21, 22], [30, 31, 32], [11, 12], [5, 6, 7, 8]]
    cases = {  # outputs so far -> what the reference sees as the text before the next token
        0: [1, 2, 10],  # bans 11 (and 7 always)
        2: [20, 21],  # bans 22
        4: [30, 20, 21, 3, 30, 31],  # bans 32, not 22
        6: [],  # no output yet: only the one-token word
        8: [10, 11],  # after a whole word: bans 12 ([11, 12]) but not 11 again
    }
    state = admitted(
        *(new_seq(r, [10, 20, 21], o, bad_words_token_ids=words) for r, o in cases.items())
    )
    reference = NoBadWordsLogitsProcessor(words, eos_token_id=None)

    def expect(outputs):
        # The reference sees the output only (the prompt, [10, 20, 21], would ban 22 as well).
        return lambda scores: reference(output_ids(outputs), scores)

    check_batch(state, {r: expect(o) for r, o in cases.items()}, num_rows=9)


def test_min_p_matches_transformers_after_temperature() -> None:
    state = admitted(
        new_seq(0, [1], temperature=0.7, min_p=0.1),
        new_seq(2, [1], temperature=1.5, min_p=0.5),
    )
    scaled = random_logits(4, seed=5)
    step = state.for_step([0, 1, 2, 3])
    got = step.truncate(scaled)
    for row, min_p in ((0, 0.1), (2, 0.5)):
        expected = MinPLogitsWarper(min_p)(None, scaled[row : row + 1])[0]
        assert torch.equal(got[row], expected)
    assert torch.equal(got[1::2], scaled[1::2])
    assert got is not scaled and torch.equal(scaled, random_logits(4, seed=5))  # logprobs read it


def reference_step(logits_row, outputs, prompt, c: LogitControls) -> torch.Tensor:
    """One row through transformers' processors (and OpenAI's rule), in the sampler's order."""
    scores = logits_row[None].clone()
    seen = torch.tensor([prompt + outputs])
    scores = PrefixConstrainedLogitsProcessor(
        lambda batch_id, ids: c.allowed_token_ids, num_beams=1
    )(seen, scores)
    bias = SequenceBiasLogitsProcessor([[[t], b] for t, b in c.logit_bias.items()])
    scores = bias(seen, scores)
    scores = NoBadWordsLogitsProcessor(c.bad_words_token_ids, eos_token_id=None)(
        output_ids(outputs), scores
    )
    scores = RepetitionPenaltyLogitsProcessor(c.repetition_penalty)(seen, scores)
    for token in set(outputs):
        count = outputs.count(token)
        scores[0, token] -= c.presence_penalty + c.frequency_penalty * count
    return scores[0]


EVERY_CONTROL = LogitControls(
    repetition_penalty=1.5,
    presence_penalty=0.8,
    frequency_penalty=0.6,
    logit_bias={4: 3.0, 9: -2.0},
    allowed_token_ids=list(range(0, VOCAB, 2)),
    bad_words_token_ids=[[8], [10, 12], [12, 14, 16]],
)


def every_control(seq_id: int, prompt: list[int], outputs: list[int] = ()) -> NewSeq:
    fields = {name: getattr(EVERY_CONTROL, name) for name in EVERY_CONTROL.__struct_fields__}
    return new_seq(seq_id, prompt, outputs, **fields)


def test_every_control_at_once_over_twelve_steps_counts_what_was_drawn() -> None:
    """Greedy rows through the sampler: each step's token equals the argmax of the reference
    over the same logits and the tokens drawn so far, so the counts and windows that the
    sampler updates after each draw are right."""
    prompt = random_ids(random.Random(3), 16)
    seq = every_control(0, prompt)
    state, sampler = admitted(seq), Sampler(0, DEVICE)
    rows = [SampleRow(seq.sampling, 0, 0), SampleRow(settings(), 0, 0)]
    outputs: list[int] = []
    for step in range(12):
        logits = random_logits(2, seed=100 + step)
        tokens, _ = sampler.sample(logits.clone(), rows, state.for_step([0, 1]))
        expected = reference_step(logits[0], outputs, prompt, EVERY_CONTROL)
        assert tokens.tolist() == [expected.argmax().item(), logits[1].argmax().item()]
        outputs.append(tokens[0].item())
    assert len(set(outputs)) > 6  # the penalties steered the draws away from repeats


def test_a_readmitted_sequence_starts_from_what_it_had_drawn() -> None:
    """After a preemption the plan re-admits a sequence with its prompt and outputs: its state
    equals that of the sequence that drew them step by step."""
    prompt = random_ids(random.Random(4), 16)
    seq = every_control(0, prompt)
    state, sampler = admitted(seq), Sampler(0, DEVICE)
    rows = [SampleRow(seq.sampling, 0, 0)]
    outputs = []
    for step in range(10):
        tokens, _ = sampler.sample(random_logits(1, seed=step), rows, state.for_step([0]))
        outputs.append(tokens.item())
    state.release([0])
    assert len(state) == 0 and all(len(kind.pool) == 0 for kind in state.kinds)
    fresh = admitted(every_control(0, prompt, outputs))
    logits = random_logits(1, seed=99)
    continued = admitted(every_control(5, prompt))  # the same draws, recorded one by one
    for token in outputs:
        continued.for_step([5]).record(torch.tensor([token]))
    assert torch.equal(processed(fresh, [0], logits), processed(continued, [5], logits))
    expected = reference_step(logits[0], outputs, prompt, EVERY_CONTROL)
    torch.testing.assert_close(processed(fresh, [0], logits)[0], expected, rtol=1e-6, atol=1e-6)


def test_a_batch_without_controlled_rows_builds_nothing() -> None:
    state = admitted(new_seq(0, [1], repetition_penalty=1.2), new_seq(1, [1]))
    assert len(state) == 1  # a sequence without controls keeps no state
    assert state.for_step([1, 2, 3]) is None
    assert state.for_step([3, 0]) is not None


def test_logprobs_see_the_controls_but_not_min_p() -> None:
    """Logprobs are taken after temperature, from the controlled logits, before min_p."""
    seq = new_seq(0, [3, 4], temperature=0.5, min_p=0.3, logit_bias={2: 4.0}, logprobs=3)
    state = admitted(seq)
    logits = random_logits(1, seed=8)
    _, logprobs = Sampler(0, DEVICE).sample(
        logits.clone(), [SampleRow(seq.sampling, 2, 0)], state.for_step([0])
    )
    biased = logits.clone()
    biased[0, 2] += 4.0
    expected = torch.log_softmax(biased / 0.5, dim=-1)
    torch.testing.assert_close(logprobs.top_values, expected.topk(3).values)


@pytest.mark.parametrize("one_pass", [False, True], ids=["torch", "one-pass"])
def test_draws_stay_inside_min_p_and_the_allowed_ids(one_pass: bool) -> None:
    """Both draws (the one-pass kernel in Triton's interpreter on a CPU machine)."""
    if one_pass:
        pytest.importorskip("triton")
    device = torch.device("cuda" if one_pass and torch.cuda.is_available() else "cpu")
    probs = torch.tensor([0.4, 0.1, 0.24, 0.16, 0.06, 0.04])
    seq = NewSeq(0, 1, settings(temperature=1.0, min_p=0.2, allowed_token_ids=[0, 2, 3, 4]), [0])
    state = SamplingControls(device, 6)
    state.admit(seq)
    logits = probs.log().repeat(300, 1).to(device)
    seq_ids = [0] * 300  # one sequence on every row: enough draws to see each kept token
    tokens, _ = Sampler(0, device, one_pass=one_pass).sample(
        logits, [SampleRow(seq.sampling, 1, 0)] * 300, state.for_step(seq_ids)
    )
    # 1 is not allowed; 0.06 is below 0.2 * 0.4 (of the allowed, renormalised alike).
    assert set(tokens.tolist()) == {0, 2, 3}
