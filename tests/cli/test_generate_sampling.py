"""`aioworker generate`'s sampling options: each logit control reaches SamplingParams (bad
words through the model's tokenizer), a bad value names its option, and the controls act on a
real answer."""

from __future__ import annotations

import argparse
import json

import pytest

from aioworker.checkpoint.tokenizer import Tokenizer
from aioworker.cli.generate import add_arguments
from aioworker.cli.generate_sampling import sampling_params
from aioworker.config import load_config
from tests.cli.test_generate_cli import aioworker


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return parser.parse_args(["--prompt", "x", *argv])


def test_every_control_option_reaches_the_params(embedded_model_dir) -> None:
    args = parse(
        "--repetition-penalty", "1.2", "--presence-penalty", "0.5", "--frequency-penalty", "-1",
        "--min-p", "0.05", "--logit-bias", '{"13": -100, "7": 2.5}', "--allowed-token-ids",
        "[1, 2, 13]", "--bad-words", "Paris", "--bad-words", "New York", "--seed", "-1",
    )  # fmt: skip
    params = sampling_params(args, load_config(overrides={"model.path": str(embedded_model_dir)}))
    assert (params.repetition_penalty, params.presence_penalty) == (1.2, 0.5)
    assert (params.frequency_penalty, params.min_p, params.seed) == (-1.0, 0.05, None)
    assert params.logit_bias == {13: -100.0, 7: 2.5}
    assert params.allowed_token_ids == (1, 2, 13)
    tokenizer = Tokenizer(embedded_model_dir)
    spelled = [tokenizer.encode(t, add_special_tokens=False) for t in ("Paris", " Paris")]
    assert list(map(list, params.bad_words_token_ids[:2])) == spelled
    assert len(params.bad_words_token_ids) == 4


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--logit-bias", "{13: 1}"], "--logit-bias is not valid JSON"),
        (["--logit-bias", '{"x": 1}'], "--logit-bias must map token ids to numbers"),
        (["--allowed-token-ids", '[1, "2"]'], "--allowed-token-ids must be a list of token ids"),
        (["--repetition-penalty", "0"], "repetition_penalty is 0.0; it must be finite and > 0"),
        (["--seed", "-2"], "seed is -2"),
    ],
)
def test_a_bad_option_names_itself(argv: list[str], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        sampling_params(parse(*argv), load_config())


def test_bad_words_keep_a_word_out_of_a_real_answer(embedded_model_dir) -> None:
    """The greedy answer names Paris (tests/cli/test_generate_cli.py): banned, it cannot."""
    result = aioworker(
        "generate", "--chat", "--json", "--prompt", "What is the capital of France?",
        "--bad-words", "Paris", "--max-tokens", "32", "--model", str(embedded_model_dir),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    [record] = [json.loads(line) for line in result.stdout.splitlines()]
    assert record["text"] and "Paris" not in record["text"]


def test_allowed_ids_and_bias_reach_the_sampler(embedded_model_dir) -> None:
    """Sampled without a seed (-1): only 5, 6 and 7 may be drawn, and +100 on 6 leaves the
    others no chance (nor any above min_p)."""
    result = aioworker(
        "generate", "--json", "--prompt-token-ids", "[1, 2, 3]", "--max-tokens", "4",
        "--ignore-eos", "--temperature", "1", "--seed", "-1", "--min-p", "0.5",
        "--allowed-token-ids", "[5, 6, 7]", "--logit-bias", '{"6": 100}',
        "--model", str(embedded_model_dir),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    [record] = [json.loads(line) for line in result.stdout.splitlines()]
    assert record["token_ids"] == [6, 6, 6, 6]
