"""aioworker: the per-rank worker of an LLM inference service."""

__version__ = "0.1.0"
