"""Stop strings in a stream of text (text in, text out; no tokens): find one across delta
boundaries, and hold back only the text that could still be the start of one.

The worker and the API server run the same matcher over the same detokenized tokens, so they
agree on where a request stopped: the worker to end it without spending more steps, the server
to cut the text it returns.
"""

from __future__ import annotations


class StopStringMatcher:
    """Feed text deltas; get back the text that is safe to show. After a match, `matched` names
    the stop string and nothing more is ever returned."""

    def __init__(self, stop: tuple[str, ...] | list[str]) -> None:
        self.stop = tuple(stop)
        self._longest = max((len(s) for s in self.stop), default=0)
        self._held = ""  # text that may still be the start of a stop string
        self.matched: str | None = None

    def feed(self, delta: str) -> str:
        """The part of (held text + delta) that can be shown now."""
        if self.matched is not None or not delta:
            return ""
        if not self.stop:
            return delta
        text = self._held + delta
        found = self._earliest_match(text)
        if found is not None:
            index, stop = found
            self.matched, self._held = stop, ""
            return text[:index]
        keep = self._held_back_length(text)
        self._held = text[len(text) - keep :] if keep else ""
        return text[: len(text) - keep]

    def flush(self) -> str:
        """At the end of the request: the text held back, which turned out not to be a stop."""
        held, self._held = self._held, ""
        return held if self.matched is None else ""

    def _earliest_match(self, text: str) -> tuple[int, str] | None:
        """The stop string that completes first (then the longest of those ending there): the
        worker learns of text token by token and must stop at the first completion, and the
        answer must not depend on how the text was split into deltas."""
        best: tuple[int, str] | None = None
        for stop in self.stop:
            index = text.find(stop)
            if index < 0:
                continue
            end, best_end = index + len(stop), best and best[0] + len(best[1])
            if best is None or end < best_end or (end == best_end and index < best[0]):
                best = (index, stop)
        return best

    def _held_back_length(self, text: str) -> int:
        """The longest suffix of `text` that is a proper prefix of some stop string."""
        for length in range(min(self._longest - 1, len(text)), 0, -1):
            suffix = text[-length:]
            if any(stop.startswith(suffix) for stop in self.stop):
                return length
        return 0
