"""Tools users run against OpenAI-compatible servers, run unmodified against `aioworker serve
--api-port`: NVIDIA's aiperf load generator (completions and chat, streamed) and EleutherAI's
lm-eval `local-completions` loglikelihood path (logprobs with echo). They live in `.venv-tools`
(tools/setup.sh), beside ours, with their own dependencies."""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

TOOLS = Path(__file__).resolve().parents[2] / ".venv-tools" / "bin"
# Each context and the choices lm-eval scores after it (the answer's index last).
TASK_ROWS = [
    ("The capital of France is", ["Paris", "London", "Rome"], 0),
    ("Two plus two equals", ["four", "seven", "ten"], 0),
    ("The colour of the sky on a clear day is", ["green", "blue", "red"], 1),
]


def tool(name: str) -> str:
    path = TOOLS / name
    assert path.exists(), f"{path} is missing: run tools/setup.sh, which installs it"
    return str(path)


def run_tool(argv: list[str], cwd: Path, timeout: float = 600) -> subprocess.CompletedProcess:
    # The tools' scratch (aiperf's mmap folders) removed after them; a short path, as their
    # sockets' paths must be (a unix socket's is at most 107 bytes)
    with tempfile.TemporaryDirectory(prefix="tool-") as scratch:
        env = {**os.environ, "TMPDIR": scratch}
        done = subprocess.run(
            argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
        )
    assert done.returncode == 0, (
        f"{argv[0]} exited {done.returncode}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    )
    return done


@pytest.mark.parametrize("endpoint", ["completions", "chat"])
def test_aiperf_streams_every_request_without_a_failure(
    live, embedded_model_dir: Path, tmp_path: Path, endpoint: str
):
    num_requests = 16
    argv = [tool("aiperf"), "profile", "--model", live.config.api.served_model_name or "embedded"]
    argv += ["--url", live.url, "--endpoint-type", endpoint, "--streaming"]
    argv += ["--tokenizer", str(embedded_model_dir), "--random-seed", "7"]
    argv += ["--synthetic-input-tokens-mean", "64", "--synthetic-input-tokens-stddev", "0"]
    argv += ["--output-tokens-mean", "16", "--output-tokens-stddev", "0"]
    argv += ["--concurrency", "4", "--request-count", str(num_requests), "--ui-type", "none"]
    argv += ["--output-artifact-dir", str(tmp_path / "artifacts")]
    run_tool(argv, tmp_path)
    [export] = (tmp_path / "artifacts").rglob("profile_export_aiperf.json")
    report = json.loads(export.read_text())
    assert report["error_summary"] == []
    assert report["completed_request_count"]["avg"] == num_requests
    assert report["request_error_rate"]["avg"] == 0
    # Streamed: every request had a first token and tokens after it.
    assert report["time_to_first_token"]["count"] == num_requests
    assert report["output_token_count"]["sum"] >= num_requests * 8


def test_lm_eval_loglikelihoods_equal_transformers(live, embedded_model_dir: Path, tmp_path: Path):
    tasks = write_task(tmp_path / "tasks")
    model_args = f"model=embedded,base_url={live.url}/v1/completions,tokenizer={embedded_model_dir}"
    model_args += ",tokenizer_backend=huggingface,num_concurrent=2,max_retries=1"
    argv = [tool("lm_eval"), "--model", "local-completions", "--model_args", model_args]
    argv += ["--tasks", "aioworker_tiny", "--include_path", str(tasks)]
    argv += ["--output_path", str(tmp_path / "out"), "--log_samples"]
    run_tool(argv, tmp_path)
    [samples] = (tmp_path / "out").rglob("samples_aioworker_tiny_*.jsonl")
    scored = [
        (args["arg_0"], args["arg_1"], float(resp[0][0]))
        for line in samples.read_text().splitlines()
        for args, resp in zip(
            json.loads(line)["arguments"].values(), json.loads(line)["resps"], strict=True
        )
    ]
    assert len(scored) == sum(len(choices) for _, choices, _ in TASK_ROWS)
    reference = ReferenceScorer(embedded_model_dir)
    for context, continuation, loglikelihood in scored:
        assert loglikelihood == pytest.approx(reference(context, continuation), abs=1e-3)


def write_task(folder: Path) -> Path:
    folder.mkdir()
    rows = [{"question": q, "choices": c, "answer": a} for q, c, a in TASK_ROWS]
    (folder / "data.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    (folder / "tiny.yaml").write_text(
        "task: aioworker_tiny\n"
        "dataset_path: json\n"
        f"dataset_kwargs:\n  data_files:\n    test: {folder / 'data.jsonl'}\n"
        "test_split: test\n"
        "output_type: multiple_choice\n"
        'doc_to_text: "{{question}}"\n'
        'doc_to_choice: "{{choices}}"\n'
        'doc_to_target: "{{answer}}"\n'
        "metric_list:\n  - metric: acc\n"
    )
    return folder


class ReferenceScorer:
    """transformers' log-likelihood of a continuation, its tokens split off the way lm-eval
    splits them (the pair encoded whole, the context's tokens removed from the front)."""

    def __init__(self, model_dir: Path) -> None:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.torch = torch
        self.tokenizer = AutoTokenizer.from_pretrained(model_dir)
        self.model = AutoModelForCausalLM.from_pretrained(model_dir, torch_dtype=torch.float32)

    def __call__(self, context: str, continuation: str) -> float:
        whole = self.tokenizer(context + continuation, add_special_tokens=False).input_ids
        num_context = len(self.tokenizer(context, add_special_tokens=False).input_ids)
        with self.torch.no_grad():
            logits = self.model(self.torch.tensor([whole])).logits[0].float()
        logprobs = logits.log_softmax(-1)
        return sum(logprobs[i - 1, whole[i]].item() for i in range(num_context, len(whole)))
