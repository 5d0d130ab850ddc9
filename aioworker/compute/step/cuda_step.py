"""The CUDA runner's prepared step."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from aioworker.compute.step.stages import PreparedStep


@dataclass(kw_only=True)
class CudaStep(PreparedStep):
    """The CUDA runner's prepared step: host arrays, and whether the captured graphs run it."""

    nums: np.ndarray  # tokens per scheduled sequence
    starts: np.ndarray  # position of each one's first token
    rows: np.ndarray  # each one's row of the block-table matrix
    token_ids: np.ndarray  # the plan's input ids, PENDING_TOKEN where the device fills them
    use_graphs: bool
    use_verify_graphs: bool = False
    sampled_rows: torch.Tensor | None = None  # set by forward: the rows whose tokens are kept
