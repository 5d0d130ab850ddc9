"""Weights update time on the GPU for the Llama-3.1-8B shape: from disk and by CUDA IPC from a
trainer process, beside restarting the rank from scratch on the same checkpoint.

    python tools/bench_weights_update.py [--dir /tmp/llama8b]
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import torch
from safetensors.torch import save_file

from aioworker.bench.gpu import LLAMA_8B
from aioworker.bench.report import format_table
from aioworker.checkpoint.model_config import load_model_config
from tests.workers import admin, deployment, start_worker, stop, wait_ready


def hf_shapes(cfg) -> dict[str, tuple[int, ...]]:
    h, i, q, kv = cfg.hidden_size, cfg.intermediate_size, cfg.q_size, cfg.kv_size
    shapes = {
        "model.embed_tokens.weight": (cfg.vocab_size, h),
        "model.norm.weight": (h,),
        "lm_head.weight": (cfg.vocab_size, h),
    }
    for n in range(cfg.num_hidden_layers):
        p = f"model.layers.{n}."
        shapes |= {
            p + "input_layernorm.weight": (h,), p + "post_attention_layernorm.weight": (h,),
            p + "self_attn.q_proj.weight": (q, h), p + "self_attn.k_proj.weight": (kv, h),
            p + "self_attn.v_proj.weight": (kv, h), p + "self_attn.o_proj.weight": (h, q),
            p + "mlp.gate_proj.weight": (i, h), p + "mlp.up_proj.weight": (i, h), p + "mlp.down_proj.weight": (h, i),
        }  # fmt: skip
    return shapes


def write_checkpoint(directory: Path) -> None:
    """A random bf16 checkpoint of the 8B shape, sharded like Hugging Face's (~4 GB files)."""
    cfg = load_model_config(LLAMA_8B)
    directory.mkdir(parents=True, exist_ok=True)
    shutil.copy(LLAMA_8B / "config.json", directory / "config.json")
    shard, shard_bytes, index, number = {}, 0, {}, 0
    items = list(hf_shapes(cfg).items())
    for k, (name, shape) in enumerate(items):
        shard[name] = (
            (torch.rand(shape, device="cuda", dtype=torch.bfloat16) - 0.5).mul_(0.05).cpu()
        )
        shard_bytes += shard[name].numel() * 2
        if shard_bytes > 4 << 30 or k == len(items) - 1:
            file = f"model-{number:05d}.safetensors"
            save_file(shard, str(directory / file), metadata={"format": "pt"})
            index |= {n: file for n in shard}
            shard, shard_bytes, number = {}, 0, number + 1
    (directory / "model.safetensors.index.json").write_text(json.dumps({"weight_map": index}))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--dir", default="/tmp/llama8b")
    args = parser.parse_args()
    directory = Path(args.dir)
    started = time.monotonic()
    write_checkpoint(directory)
    print(f"wrote the checkpoint in {time.monotonic() - started:.1f}s", flush=True)
    overrides = {
        "model.path": str(directory),
        "device.kind": "cuda",
        "model.max_model_len": 4096,
        "cache.gpu_memory_utilization": 0.45,
    }
    config, set_args = deployment(**overrides)
    started = time.monotonic()
    worker = start_worker(0, set_args)
    try:
        wait_ready(config, [worker], timeout=600)
        restart_s = time.monotonic() - started
        disk = admin(config, "update-weights", str(directory), timeout=600, mode="keep")
        trainer = subprocess.run(
            [sys.executable, "-m", "tests.ipc_trainer", str(directory), config.runtime.name],
            capture_output=True, text=True, timeout=600,
        )  # fmt: skip
        ipc = (
            json.loads(trainer.stdout.strip().splitlines()[-1])
            if trainer.returncode == 0
            else {"ok": False, "message": trainer.stderr[-500:]}
        )
    finally:
        stop([worker])
    rows = [
        [
            "restart the rank from scratch (spawn to READY: load, profile, capture)",
            f"{restart_s:.1f}",
        ],
        [
            "update from disk (stage 16 GB on the host, validate, copy in)",
            f"{disk.data.get('seconds', float('nan')):.1f}" if disk.ok else disk.message,
        ],
        [
            "update by CUDA IPC from a trainer process",
            f"{ipc.get('seconds', float('nan')):.1f}" if ipc["ok"] else ipc["message"],
        ],
    ]
    print(format_table(["Llama-3.1-8B shape, bf16, one H200", "seconds"], rows))


if __name__ == "__main__":
    main()
