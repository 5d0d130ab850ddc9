"""On the GPU machine: whether a model's logits stay finite through a prefill and a few greedy
decode steps, and in the prefill (eager: hooks run) the first decoder layer whose output is not.
A broken kernel shows as NaN long before it shows in a benchmark's timing. With
device.cuda_graphs=false the decode steps are eager too, so the hooks see them.

    python tools/finite_logits.py [--model llama-3.1-8b] [--quantization wint8] [--tokens 8]
        [--set device.small_batch_kernels=false ...]

Prints one line a sampled step (rows, finite or how many NaN and inf) and a verdict last; exits 1
where any step's logits were not finite.
"""

from __future__ import annotations

import argparse
import random
import sys

import torch

from aioworker.bench.finite import greedy_step_logits
from aioworker.bench.gpu import MODELS, make_engine, random_prompt
from aioworker.cli.common import parse_settings


def first_output(output):
    return output[0] if isinstance(output, tuple) else output


def capturing(tensor: torch.Tensor) -> bool:
    """A graph capture runs the hooks too, where a sync is forbidden."""
    return tensor.is_cuda and torch.cuda.is_current_stream_capturing()


def watch_layers(model, seen: list[str]) -> None:
    """Record the first decoder layer whose output holds a non-finite value, in eager forwards
    (a graph's replays run no hooks): which forward (0: the prefill) and which layer."""
    forwards = [0]
    for index, layer in enumerate(model.model.layers):

        def hook(module, inputs, output, index=index):
            hidden = first_output(output)
            if not torch.is_tensor(hidden) or capturing(hidden):
                return
            if index == len(model.model.layers) - 1:
                forwards[0] += 1
            if not seen and not bool(torch.isfinite(hidden).all()):
                rows = hidden.reshape(-1, hidden.shape[-1]).shape[0]
                seen.append(f"forward {forwards[0]} ({rows} rows), layer {index}")

        layer.register_forward_hook(hook)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="llama-3.1-8b")
    parser.add_argument("--quantization", default="none")
    parser.add_argument("--tokens", type=int, default=8)
    parser.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE", help="any config key"
    )
    args = parser.parse_args()
    settings = {"model.quantization": args.quantization, "device.max_capture_batch_size": 16}
    engine = make_engine(MODELS / args.model, 4096, **settings, **parse_settings(args.set, "--set"))
    seen: list[str] = []
    watch_layers(engine.executor.runner.model, seen)
    prompt = random_prompt(1024, 10000, random.Random(4))
    steps = greedy_step_logits(engine, prompt, args.tokens)
    for index, step in enumerate(steps):
        print(f"step {index}: {step.rows} row(s), {step.nan} NaN, {step.inf} inf")
    broken = [step for step in steps if not step.finite]
    print(
        f"{args.model} {args.quantization} {args.set}: "
        + ("FINITE" if not broken else f"NOT FINITE in {len(broken)} of {len(steps)} steps")
        + (f"; first non-finite layer output: {seen[0]}" if seen else "")
    )
    return 1 if broken else 0


if __name__ == "__main__":
    sys.exit(main())
