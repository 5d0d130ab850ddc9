"""How `aioworker generate` shows results, offline or remote: one prompt streams to the terminal,
several print as blocks when each finishes, and --json prints one object per prompt at the end
(with logprobs, where asked for)."""

from __future__ import annotations

import json
import sys

from aioworker.checkpoint.tokenizer import Tokenizer
from aioworker.core.output_text import OutputText
from aioworker.core.outputs import Completion, RequestOutput, TokenLogprobs


class ResultPrinter:
    def __init__(
        self,
        tokenizer: Tokenizer | None,
        prompts: list,
        as_json: bool,
        stop: tuple[str, ...] = (),
    ) -> None:
        self.tokenizer = tokenizer
        self.prompts = prompts
        self.as_json = as_json
        self.completions = [Completion(str(index)) for index in range(len(prompts))]
        # Text as the workers cut it: without a stop string, or anything after it.
        self.texts = [OutputText(tokenizer, stop) if tokenizer else None for _ in prompts]
        self.stream_live = not as_json and len(prompts) == 1 and tokenizer is not None

    def add(self, index: int, out: RequestOutput) -> None:
        completion, stream = self.completions[index], self.texts[index]
        completion.add(out)
        if stream is not None:
            delta = stream.add(out.token_ids) + (stream.finish() if out.finished else "")
            completion.text += delta
            if self.stream_live:
                sys.stdout.write(delta)
                sys.stdout.flush()
        if not out.finished:
            return
        if out.error:
            print(
                f"aioworker: prompt {index} ended ({out.finish_reason}): {out.error}",
                file=sys.stderr,
            )
        if not self.stream_live and not self.as_json:
            print(f"--- prompt {index} ---\n{self.text(index)}", flush=True)

    def text(self, index: int) -> str | None:
        return self.completions[index].text if self.tokenizer else None

    def finish(self) -> int:
        """Print what remains; returns the exit code (1 if any request failed)."""
        if self.stream_live:
            sys.stdout.write("\n")
        if self.as_json:
            for index, prompt in enumerate(self.prompts):
                print(json.dumps(self.record(index, prompt), ensure_ascii=False))
        reasons = [c.finish_reason for c in self.completions]
        return 1 if any(reason == "error" for reason in reasons) else 0

    def record(self, index: int, prompt) -> dict:
        completion = self.completions[index]
        record = {
            "index": index,
            "prompt": prompt,
            "token_ids": completion.token_ids,
            "text": self.text(index),
            "finish_reason": completion.finish_reason and str(completion.finish_reason),
        }
        if completion.stop_string is not None:
            record["stop_string"] = completion.stop_string
        if completion.logprobs is not None:
            record["logprobs"] = [self._entry(e) for e in completion.logprobs]
        if completion.prompt_logprobs is not None:
            record["prompt_logprobs"] = [self._entry(e) for e in completion.prompt_logprobs]
        if completion.error:
            record["error"] = completion.error
        return record

    def _entry(self, entry: TokenLogprobs) -> dict:
        """A token's logprob, with its text where there is a tokenizer."""
        top = [
            {"token_id": t, "logprob": lp, **self._token_text(t)}
            for t, lp in zip(entry.top_token_ids, entry.top_logprobs, strict=True)
        ]
        return {
            "token_id": entry.token_id,
            "logprob": entry.logprob,
            **self._token_text(entry.token_id),
            "top_logprobs": top,
        }

    def _token_text(self, token_id: int) -> dict:
        if self.tokenizer is None:
            return {}
        return {"token": self.tokenizer.decode([token_id], skip_special_tokens=False)}
