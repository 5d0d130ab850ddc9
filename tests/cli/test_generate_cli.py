"""The `aioworker` command line, run as a user would run it."""

from __future__ import annotations

import json
import subprocess
import sys


def aioworker(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "aioworker.cli.main", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_generate_json_gives_one_object_per_prompt(embedded_model_dir) -> None:
    result = aioworker(
        "generate", "--json", "--model", str(embedded_model_dir),
        "--prompt-token-ids", "[[1, 2, 3], [4, 5]]", "--prompt", "The sky is", "--max-tokens", "5",
        "--ignore-eos", "--logprobs", "2", "--prompt-logprobs", "1",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    records = [json.loads(line) for line in result.stdout.splitlines()]
    assert [r["index"] for r in records] == [0, 1, 2]
    assert all(len(r["token_ids"]) == 5 and r["finish_reason"] == "length" for r in records)
    # Text prompts come first, then token-id prompts.
    assert records[0]["prompt"] == "The sky is" and isinstance(records[0]["text"], str)
    assert records[1]["prompt"] == [1, 2, 3]
    for record in records:
        assert [e["token_id"] for e in record["logprobs"]] == record["token_ids"]
        assert all(len(e["top_logprobs"]) == 2 and e["logprob"] <= 0 for e in record["logprobs"])
    assert [e["token_id"] for e in records[1]["prompt_logprobs"]] == [2, 3]


def test_generate_stop_string_cuts_the_answer(embedded_model_dir) -> None:
    result = aioworker(
        "generate", "--chat", "--json", "--prompt", "What is the capital of France?",
        "--stop", "Paris", "--model", str(embedded_model_dir),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    [record] = [json.loads(line) for line in result.stdout.splitlines()]
    assert record["finish_reason"] == "stop" and record["stop_string"] == "Paris"
    assert record["text"] and "Paris" not in record["text"]


def test_generate_streams_a_chat_answer(embedded_model_dir) -> None:
    result = aioworker(
        "generate", "--chat", "--prompt", "What is the capital of France?", "--model", str(embedded_model_dir)
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "Paris" in result.stdout


def test_bad_arguments_exit_2_with_a_message() -> None:
    result = aioworker("generate", "--prompt", "x", "--top-p", "2")
    assert result.returncode == 2
    assert "top_p is 2.0; it must be in (0, 1]" in result.stderr
    result = aioworker("generate")
    assert result.returncode == 2 and "give at least one --prompt" in result.stderr
    result = aioworker("generate", "--prompt", "x", "--set", "cache.blok_size=3")
    assert result.returncode == 2 and "blok_size" in result.stderr


def test_help_lists_the_commands() -> None:
    result = aioworker("--help")
    assert result.returncode == 0
    for command in ("generate", "convert"):
        assert command in result.stdout
