"""The draft model where the executor drafts (speculative.method "draft"): the target's first
layers (a self-draft), or a model of its own loaded beside the target. Every way it cannot work
with this target stops start-up with a ConfigError naming the key to change."""

from __future__ import annotations

import logging

from aioworker.checkpoint.model_config import ModelConfig, load_model_config
from aioworker.checkpoint.source import resolve_model_path
from aioworker.compute.model_loading import build_model, fill_weights, linear_methods
from aioworker.compute.models.self_draft import SelfDraft
from aioworker.compute.models.separate_draft import SeparateDraft
from aioworker.compute.parallel import SINGLE, TensorParallel
from aioworker.config import ConfigError, WorkerConfig

log = logging.getLogger(__name__)


def build_draft(
    target,
    target_config: ModelConfig,
    config: WorkerConfig,
    tp: TensorParallel,
    max_model_len: int,
    progress: bool,
) -> SelfDraft | SeparateDraft | None:
    options = config.speculative
    if options.method != "draft":
        return None
    draft_tp = _draft_tensor_parallel(options.draft_tensor_parallel_size, tp)
    if not options.model:
        if draft_tp is not tp:
            raise ConfigError(
                "speculative.draft_tensor_parallel_size is 1, but a self-draft is the target's "
                "own layers, split as the target is; leave it 0, or set speculative.model"
            )
        try:
            return SelfDraft(target, options.draft_layers)
        except ValueError as error:
            raise ConfigError(str(error)) from None
    return _separate_draft(target, target_config, config, draft_tp, max_model_len, progress)


def _draft_tensor_parallel(size: int, tp: TensorParallel) -> TensorParallel:
    """0 or the target's size: split like the target; 1: a whole copy on every rank."""
    if size in (0, tp.size):
        return tp
    if size == 1:
        return SINGLE
    raise ConfigError(
        f"speculative.draft_tensor_parallel_size is {size}; give 0 (the target's, "
        f"{tp.size}) or 1 (a whole draft on every rank)"
    )


def _separate_draft(
    target, target_config: ModelConfig, config: WorkerConfig, tp, max_model_len, progress
) -> SeparateDraft:
    path = config.speculative.model
    try:
        model_dir = resolve_model_path(path, progress)
        draft_config = load_model_config(model_dir)
    except (OSError, ValueError) as error:
        raise ConfigError(f"speculative.model {path!r}: {error}") from None
    if draft_config.vocab_size != target_config.vocab_size:
        raise ConfigError(
            f"speculative.model {path!r} has a vocabulary of {draft_config.vocab_size} tokens "
            f"and the target {target_config.vocab_size}; a draft must use the target's "
            "tokenizer"
        )
    weight = next(target.parameters())
    methods = linear_methods(draft_config, config, weight.device)
    model = build_model(draft_config, max_model_len, tp, weight.device, weight.dtype, methods)
    fill_weights(model, model_dir, config, progress, config.model.seed + 1)
    log.info(
        "draft model %s: %d layers, hidden size %d", model_dir, draft_config.num_hidden_layers,
        draft_config.hidden_size,
    )  # fmt: skip
    return SeparateDraft(model)
