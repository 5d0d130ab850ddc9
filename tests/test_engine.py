"""The offline engine on the embedded SmolLM2 model: batch invariance, preemption, real answers,
and bad input."""

from __future__ import annotations

import json
import random

import msgspec
import pytest

from aioworker.checkpoint.model_config import ModelConfigError
from aioworker.checkpoint.source import ModelNotFoundError
from aioworker.core.detokenizer import IncrementalDetokenizer
from aioworker.core.outputs import FinishReason
from aioworker.core.sampling_params import InvalidRequestError, SamplingParams
from tests.conftest import make_engine
from tests.logprob_checks import assert_logprobs_close

NUM_TOKENS = 24
GREEDY = SamplingParams(temperature=0.0, max_tokens=NUM_TOKENS, ignore_eos=True)
SEEDED = SamplingParams(
    temperature=0.9, top_p=0.95, seed=4242, max_tokens=NUM_TOKENS, ignore_eos=True
)


@pytest.fixture(scope="module")
def workload(embedded_engine):
    """Seven mixed-length requests, then the target (added last, so it is the newest)."""
    rng = random.Random(0)
    prompts = [[rng.randrange(200, 40000) for _ in range(rng.randint(5, 120))] for _ in range(6)]
    params = [GREEDY if i % 2 else msgspec.structs.replace(SEEDED, seed=i) for i in range(6)]
    target = embedded_engine.encode("Name three colours of the rainbow.", chat=True)
    # The targets also ask for logprobs: preemption and chunking must not change them either.
    scored = {"logprobs": 5, "prompt_logprobs": 2}
    targets = [msgspec.structs.replace(p, **scored) for p in (GREEDY, SEEDED)]
    return prompts + [target, target], params + targets


@pytest.fixture(scope="module")
def batch_completions(embedded_engine, workload):
    prompts, params = workload
    return embedded_engine.generate(prompts, params)


@pytest.fixture(scope="module")
def batch_outputs(batch_completions):
    return [c.token_ids for c in batch_completions]


def test_request_alone_equals_request_in_a_batch_of_8(
    embedded_engine, workload, batch_outputs
) -> None:
    prompts, params = workload
    for index in (6, 7):  # the target, greedy and seeded
        [alone] = embedded_engine.generate([prompts[index]], params[index])
        assert alone.token_ids == batch_outputs[index]
        assert len(alone.token_ids) == NUM_TOKENS


def test_preempted_and_chunked_requests_give_unchanged_output(
    embedded_model_dir, workload, batch_outputs, batch_completions
) -> None:
    prompts, params = workload
    # 20 blocks of 16 tokens cannot hold 8 growing sequences; a 48-token budget chunks prompts.
    engine = make_engine(
        embedded_model_dir,
        **{
            "cache.num_blocks": 20,
            "model.max_model_len": 320,
            "scheduler.max_num_batched_tokens": 48,
        },
    )
    preempted = []
    scheduler = engine.scheduler
    original = scheduler._preempt
    scheduler._preempt = lambda seq: (
        preempted.append((seq.seq_id, seq.num_output_tokens)),
        original(seq),
    )
    try:
        completions = engine.generate(prompts, params)
    finally:
        engine.close()
    assert [c.token_ids for c in completions] == batch_outputs
    for index in (6, 7):
        assert_logprobs_close(completions[index].logprobs, batch_completions[index].logprobs)
        prompt_scores = completions[index].prompt_logprobs
        assert_logprobs_close(prompt_scores, batch_completions[index].prompt_logprobs)
        assert len(prompt_scores) == len(prompts[index]) - 1
    # Both targets (seq ids 6 and 7) were preempted after producing some tokens.
    midway = {seq_id for seq_id, num_outputs in preempted if 0 < num_outputs < NUM_TOKENS}
    assert {6, 7} <= midway


def test_real_answer_paris(embedded_engine) -> None:
    prompt = embedded_engine.encode("What is the capital of France?", chat=True)
    [completion] = embedded_engine.generate(
        [prompt], SamplingParams(temperature=0.0, max_tokens=48)
    )
    assert "Paris" in completion.text
    assert completion.finish_reason is FinishReason.STOP  # stopped at <|im_end|>


def test_bad_words_given_as_text_keep_paris_out(embedded_engine) -> None:
    words = embedded_engine.bad_words(["Paris"])
    encode = embedded_engine.tokenizer.encode
    assert words == tuple(tuple(encode(t, add_special_tokens=False)) for t in ("Paris", " Paris"))
    prompt = embedded_engine.encode("What is the capital of France?", chat=True)
    params = SamplingParams(temperature=0.0, max_tokens=48, bad_words_token_ids=words)
    [completion] = embedded_engine.generate([prompt], params)
    assert completion.text and "Paris" not in completion.text


def boundary_stop(tokenizer, token_ids: list[int]) -> tuple[str, int]:
    """A stop string made of the end of one token's text and the start of the next's, first
    seen there; and the index of the token that completes it."""
    detokenizer = IncrementalDetokenizer(tokenizer)
    pieces = [detokenizer.add([t]) for t in token_ids]
    text = "".join(pieces)
    for k in range(2, len(pieces) - 1):
        left, right = pieces[k], pieces[k + 1]
        if len(left.strip()) >= 3 and len(right.strip()) >= 3:
            stop = left[-2:] + right[:2]
            if text.find(stop) == len("".join(pieces[:k])) + len(left) - 2:
                return stop, k + 1
    raise AssertionError(f"no two neighbouring tokens of 3+ characters in {text!r}")


def test_a_stop_string_split_across_two_tokens_ends_the_request_there(embedded_engine) -> None:
    prompt = embedded_engine.encode("Describe the city of Paris in detail.", chat=True)
    params = SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)
    [free_run] = embedded_engine.generate([prompt], params)
    stop, last_index = boundary_stop(embedded_engine.tokenizer, free_run.token_ids)
    free_blocks = embedded_engine.block_manager.num_free_blocks

    stopped = msgspec.structs.replace(params, stop=("never appears", stop))
    [completion] = embedded_engine.generate([prompt], stopped)

    assert completion.finish_reason is FinishReason.STOP and completion.stop_string == stop
    # The request ended on the token that completed the stop string: no further step.
    assert completion.token_ids == free_run.token_ids[: last_index + 1]
    assert completion.text == free_run.text[: free_run.text.find(stop)]
    assert embedded_engine.block_manager.num_free_blocks == free_blocks


def test_abort_ends_a_request_and_frees_its_blocks(embedded_engine) -> None:
    free_before = embedded_engine.block_manager.num_free_blocks
    request_id = embedded_engine.add_request([1, 2, 3, 4], SamplingParams(max_tokens=100))
    embedded_engine.step()
    assert embedded_engine.block_manager.num_free_blocks < free_before
    out = embedded_engine.abort(request_id)
    assert out.finish_reason is FinishReason.ABORT
    assert embedded_engine.block_manager.num_free_blocks == free_before
    assert embedded_engine.abort(request_id) is None
    assert not embedded_engine.has_unfinished


@pytest.mark.parametrize(
    ("prompt", "params", "message"),
    [
        ([], SamplingParams(), "prompt is empty"),
        (
            [1, 49152],
            SamplingParams(),
            r"prompt token id 49152 at index 1 is outside the vocabulary \[0, 49152\)",
        ),
        ([1] * 2049, SamplingParams(), "prompt has 2049 tokens; max_model_len is 2048"),
        ([1], SamplingParams(max_tokens=0), "max_tokens is 0"),
        ([1], SamplingParams(temperature=-1.0), "temperature is -1.0"),
        ([1], SamplingParams(top_p=0.0), r"top_p is 0.0; it must be in \(0, 1\]"),
        ([1], SamplingParams(top_p=1.01), "top_p is 1.01"),
        ([1], SamplingParams(stop_token_ids=(60000,)), "stop_token_ids holds 60000"),
    ],
)
def test_bad_request_is_rejected_and_others_keep_running(
    embedded_engine, prompt, params, message
) -> None:
    good = embedded_engine.add_request([10, 11, 12], SamplingParams(temperature=0.0, max_tokens=3))
    with pytest.raises(InvalidRequestError, match=message):
        embedded_engine.add_request(prompt, params)
    finished = [out for out in embedded_engine.stream() if out.finished]
    assert [out.request_id for out in finished] == [good]


def test_unknown_model_path_is_a_clear_error(tmp_path) -> None:
    with pytest.raises(
        ModelNotFoundError, match="does not exist; pass a Hugging Face model directory"
    ):
        make_engine(tmp_path / "nowhere")


def test_unsupported_architecture_lists_the_supported_ones(tmp_path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["GPT2LMHeadModel"]}))
    with pytest.raises(
        ModelConfigError,
        match="unsupported architecture GPT2LMHeadModel; supported: LlamaForCausalLM",
    ):
        make_engine(tmp_path)
