"""One sample's output text as its token ids arrive (token ids in, text out): the incremental
detokenizer followed by the stop-string matcher, so the text is held back only while a stop
string could still be completing, and cut where one completes.

The worker (to end a request the step its stop string appears), the offline engine and the API
server (for the text they return) each run one per request over the same tokens, so all three
agree on where it stopped.
"""

from __future__ import annotations

from aioworker.core.detokenizer import Decodes, IncrementalDetokenizer
from aioworker.core.stop_string_matcher import StopStringMatcher


class OutputText:
    def __init__(self, tokenizer: Decodes, stop: tuple[str, ...] | list[str] = ()) -> None:
        self.detokenizer = IncrementalDetokenizer(tokenizer)
        self.matcher = StopStringMatcher(stop)

    def add(self, token_ids: list[int]) -> str:
        """The text these tokens let us show."""
        return self.matcher.feed(self.detokenizer.add(token_ids))

    def finish(self) -> str:
        """At the end: text held back that turned out not to start a stop string."""
        return self.matcher.flush()

    @property
    def matched(self) -> str | None:
        """The stop string that ended the text, once one has."""
        return self.matcher.matched
