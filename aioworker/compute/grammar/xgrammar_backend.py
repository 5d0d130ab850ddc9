"""The grammar backend (core/grammar.py's GrammarBackend) on xgrammar: what a request asks for,
compiled against the model's tokenizer on a small thread pool, kept by content hash within a
byte budget, and matchers whose masks fill numpy bitmasks on the driver's mask thread."""

from __future__ import annotations

import json
import re
import threading
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import xgrammar as xgr

from aioworker.config import GuidedOptions
from aioworker.core.guided import GuidedParams
from aioworker.core.request_errors import InvalidRequestError

# The longest run of whitespace JSON may have between tokens: enough to indent nested objects,
# and short enough that a model that drifts into spaces at a high temperature comes back.
MAX_WHITESPACE = 16
# xgrammar's messages start with a time and its source file: "[06:57:34] /x/y.cc:94: ".
_XGRAMMAR_PREFIX = re.compile(r"^\[[\d:]+\] \S+:\d+: ")
# What a failed compile is charged in the cache (its message), so repeats fail at once.
_FAILURE_BYTES = 1024


class XgrammarBackend:
    def __init__(
        self,
        tokenizer_file: Path,
        vocab_size: int,
        eos_token_ids: tuple[int, ...],
        options: GuidedOptions | None = None,
    ) -> None:
        """`vocab_size`: the model's (its LM head's rows), which may exceed the tokenizer's.
        The tokenizer's vocabulary is read on the first compile, so an offline engine that never
        guides never pays for it; a serving rank reads it while it loads (`read_vocabulary`)."""
        options = options or GuidedOptions()
        self.tokenizer_file = tokenizer_file
        self.vocab_size = vocab_size
        self.eos_token_ids = eos_token_ids
        self.options = options
        self.num_mask_words = -(-vocab_size // 32)
        self.cache_bytes = options.cache_bytes
        self._compiler: xgr.GrammarCompiler | None = None
        self._compiler_lock = threading.Lock()
        self._pool = ThreadPoolExecutor(options.compile_threads, "aioworker-grammar")
        self._lock = threading.Lock()
        self._cache: OrderedDict[str, tuple[Future, int]] = OrderedDict()  # key -> (future, bytes)
        self._cached_bytes = 0
        self.num_compiled = self.num_cache_hits = 0

    # -- compiling ----------------------------------------------------------------------------

    def compile(self, guided: GuidedParams) -> Future:
        key = guided.key
        with self._lock:
            entry = self._cache.get(key)
            if entry is not None:
                self._cache.move_to_end(key)
                self.num_cache_hits += 1
                return entry[0]
            future = self._pool.submit(self._compile, key, guided)
            self._cache[key] = (future, 0)
        return future

    def _compile(self, key: str, guided: GuidedParams) -> xgr.CompiledGrammar:
        try:
            compiled = self._compile_kind(guided)
        except Exception as exc:
            self._charge(key, _FAILURE_BYTES)
            reason = _XGRAMMAR_PREFIX.sub("", str(exc)).strip()
            raise InvalidRequestError(f"guided.{guided.kind} does not compile: {reason}") from None
        self.num_compiled += 1
        self._charge(key, compiled.memory_size_bytes)
        return compiled

    def _compile_kind(self, guided: GuidedParams) -> xgr.CompiledGrammar:
        compiler = self.compiler
        # Compact: no whitespace between tokens at all; else any, as JSON allows.
        json_style = (
            {"any_whitespace": False, "separators": (",", ":")}
            if guided.compact_json
            else {"any_whitespace": True, "max_whitespace_cnt": MAX_WHITESPACE}
        )
        if guided.json_schema is not None:
            return compiler.compile_json_schema(guided.text, **json_style)
        if guided.json_object:
            return compiler.compile_json_schema('{"type": "object"}', **json_style)
        if guided.regex is not None:
            return compiler.compile_regex(guided.regex)
        if guided.grammar is not None:
            return compiler.compile_grammar(guided.grammar)
        return compiler.compile_grammar(choice_grammar(guided.choice))

    def read_vocabulary(self) -> None:
        """Read the vocabulary now. Reading it holds the GIL (tokenizers' Rust, and importing
        transformers) for 0.2 s on an idle CPU and most of a second on a busy one: on the first
        compile of a serving rank, that paused every stream and its heartbeat, and an API server
        watching with 0.3 s beats took the rank for lost."""
        _ = self.compiler

    @property
    def compiler(self) -> xgr.GrammarCompiler:
        """Made on first use, on a compile thread. The cache is ours (by content hash, in-flight
        compiles shared), not xgrammar's."""
        with self._compiler_lock:
            if self._compiler is None:
                info = tokenizer_info(self.tokenizer_file, self.vocab_size, self.eos_token_ids)
                self._compiler = xgr.GrammarCompiler(
                    info, max_threads=self.options.compile_threads, cache_enabled=False
                )
            return self._compiler

    def _charge(self, key: str, size: int) -> None:
        """Count a compile's bytes and drop the least recently used past the budget, before its
        future resolves: whoever waited for it sees the budget kept (a done-callback ran after
        the waiter woke, and a test saw the cache over its budget)."""
        with self._lock:
            entry = self._cache.get(key)
            if entry is None:
                return
            self._cache[key] = (entry[0], size)
            self._cached_bytes += size
            while self._cached_bytes > self.cache_bytes and len(self._cache) > 1:
                oldest, (old_future, old_size) = next(iter(self._cache.items()))
                if not old_future.done():
                    break
                del self._cache[oldest]
                self._cached_bytes -= old_size

    @property
    def cached_bytes(self) -> int:
        return self._cached_bytes

    # -- matching -----------------------------------------------------------------------------

    def matcher(
        self, compiled: xgr.CompiledGrammar, stop_token_ids: list[int]
    ) -> xgr.GrammarMatcher:
        return xgr.GrammarMatcher(compiled, override_stop_tokens=stop_token_ids)

    def close(self) -> None:
        """Stop compiling; xgrammar's own threads go with the objects that hold them."""
        self._pool.shutdown(wait=True, cancel_futures=True)
        self._compiler = None


def choice_grammar(choices: tuple[str, ...]) -> str:
    """An EBNF grammar that matches exactly one of `choices`."""
    literals = " | ".join(json.dumps(choice, ensure_ascii=False) for choice in choices)
    return f"root ::= {literals}"


def tokenizer_info(
    tokenizer_file: Path, vocab_size: int, eos_token_ids: tuple[int, ...]
) -> xgr.TokenizerInfo:
    """xgrammar's view of the tokenizer: every token's bytes, and how the vocabulary encodes
    them (byte-level or SentencePiece), read from tokenizer.json."""
    from transformers import PreTrainedTokenizerFast  # xgrammar's own dependency; slow import

    tokenizer = PreTrainedTokenizerFast(tokenizer_file=str(tokenizer_file))
    return xgr.TokenizerInfo.from_huggingface(
        tokenizer, vocab_size=vocab_size, stop_token_ids=list(eos_token_ids) or None
    )
