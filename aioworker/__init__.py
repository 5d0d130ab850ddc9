"""aioworker: the per-rank worker of an LLM inference service.

The names most programs need, imported on first use so that `import aioworker.x` stays cheap:

    from aioworker import Client, LLMEngine, SamplingParams, load_config
"""

from __future__ import annotations

import importlib
from typing import Any

from aioworker.version import __version__ as __version__

_EXPORTS = {
    "load_config": "aioworker.config",
    "LLMEngine": "aioworker.engine",
    "SamplingParams": "aioworker.core.sampling_params",
    "GuidedParams": "aioworker.core.guided",
    "InvalidRequestError": "aioworker.core.sampling_params",
    "RequestOutput": "aioworker.core.outputs",
    "Completion": "aioworker.core.outputs",
    "FinishReason": "aioworker.core.outputs",
    "Client": "aioworker.wire.client",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'aioworker' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
