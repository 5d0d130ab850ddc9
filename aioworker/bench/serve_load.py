"""A serving load like the ones users run against an OpenAI-compatible server: a fixed number of
streamed requests kept `concurrency` at a time, each timed at its first token and at every token
after it. TTFT is request start to first token; ITL the gap between a token and the one before
it (tokens that arrive in one read share the gap equally)."""

from __future__ import annotations

import asyncio
import statistics
import time
from dataclasses import dataclass, field

import msgspec

TOKEN_EVENT = b"data: {"
# A chat stream opens with an event that names the role and holds no token.
ROLE_EVENT = b'"delta":{"role":"assistant","content":""}'
CHUNKED_END = b"0\r\n\r\n"


@dataclass
class ServeLoad:
    endpoint: str  # "completions" or "chat"
    model: str
    prompts: list[str]
    max_tokens: int
    concurrency: int

    def body(self, prompt: str) -> dict:
        common = {
            "model": self.model,
            "max_tokens": self.max_tokens,
            "ignore_eos": True,
            "temperature": 0,
            "stream": True,
        }
        if self.endpoint == "chat":
            return {"messages": [{"role": "user", "content": prompt}], **common}
        return {"prompt": prompt, **common}

    @property
    def path(self) -> str:
        return "/v1/chat/completions" if self.endpoint == "chat" else "/v1/completions"


@dataclass
class LoadResult:
    elapsed_s: float
    num_output_tokens: int
    ttfts_s: list[float] = field(default_factory=list)
    itls_s: list[float] = field(default_factory=list)

    @property
    def output_tokens_per_s(self) -> float:
        return self.num_output_tokens / self.elapsed_s

    @property
    def ttft_p50_ms(self) -> float:
        return statistics.median(self.ttfts_s) * 1e3

    @property
    def itl_p50_ms(self) -> float:
        return statistics.median(self.itls_s) * 1e3


async def run_load(host: str, port: int, load: ServeLoad) -> LoadResult:
    pending = list(reversed(load.prompts))
    result = LoadResult(0.0, 0)

    async def worker() -> None:
        reader, writer = await asyncio.open_connection(host, port)
        try:
            while pending:
                await _stream_one(reader, writer, load, pending.pop(), result)
        finally:
            writer.close()

    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(load.concurrency)))
    result.elapsed_s = time.perf_counter() - started
    return result


async def _stream_one(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    load: ServeLoad,
    prompt: str,
    result: LoadResult,
) -> None:
    payload = msgspec.json.encode(load.body(prompt))
    head = (
        f"POST {load.path} HTTP/1.1\r\nHost: bench\r\ncontent-type: application/json\r\n"
        f"content-length: {len(payload)}\r\n\r\n"
    ).encode()
    started = time.perf_counter()
    writer.write(head + payload)
    last, received = None, b""
    while not received.endswith(CHUNKED_END):
        chunk = await reader.read(65536)
        if not chunk:
            raise ConnectionError(f"the server closed the stream: {received[-300:]!r}")
        now = time.perf_counter()
        if not received and not chunk.startswith(b"HTTP/1.1 200"):
            raise ConnectionError(f"the server answered {chunk[:300]!r}")
        received += chunk
        num_tokens = chunk.count(TOKEN_EVENT) - chunk.count(ROLE_EVENT)
        if num_tokens <= 0:
            continue
        if last is None:
            result.ttfts_s.append(now - started)
            num_tokens -= 1
        else:
            result.itls_s += [(now - last) / num_tokens] * num_tokens
        result.num_output_tokens += num_tokens + (last is None)
        last = now
