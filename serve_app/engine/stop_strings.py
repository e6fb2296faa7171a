"""Stop strings matched by the replica, across the seams of a continued request.

vLLM matches stop strings only within one request's own output and holds back
a possible stop's start while reporting its token ids. A request continued on
another replica or pool (a resume, a re-bucket) is a new engine request, so a
stop string split across the seam would be missed and the held-back text lost.
Matching here as well (vLLM still stops each attempt at a stop string's own
token) carries that text over: the next attempt decodes the tokens already
sent, takes the text the client has not seen yet, and starts matching from it.
"""

from __future__ import annotations


class StopStrings:
    """Streamed text in, the text to send out; stops at the first stop string.

    Holds back the longest tail that could still begin a stop string, and
    drops the stop string and everything after it (OpenAI's semantics)."""

    def __init__(self, stops: tuple[str, ...], carried: str = "") -> None:
        self._stops = tuple(stop for stop in stops if stop)
        self._pending = carried
        self.stopped = False
        self.matched: str | None = None
        """The stop string found, once `stopped`."""

    def feed(self, text: str) -> str:
        """The text that can go out now; sets `stopped` once a stop string is found."""
        if self.stopped:
            return ""
        buffer = self._pending + text
        found = [(index, stop) for stop in self._stops if (index := buffer.find(stop)) >= 0]
        if found:
            index, self.matched = min(found)
            self.stopped, self._pending = True, ""
            return buffer[:index]
        hold = self._possible_start(buffer)
        self._pending = buffer[len(buffer) - hold:] if hold else ""
        return buffer[: len(buffer) - hold]

    def flush(self) -> str:
        """What was held back, at the request's real end (not at a seam)."""
        pending, self._pending = self._pending, ""
        return pending

    def _possible_start(self, buffer: str) -> int:
        """Length of the longest tail of `buffer` that is a proper prefix of a stop string."""
        longest = max((len(stop) for stop in self._stops), default=1) - 1
        for size in range(min(longest, len(buffer)), 0, -1):
            tail = buffer[-size:]
            if any(stop.startswith(tail) for stop in self._stops):
                return size
        return 0


def unsent_text(continuation_text: str, sent_chars: int, stops: tuple[str, ...]) -> str:
    """The part of an earlier attempt's text that the client has not received:
    the decoded continuation after the characters already sent. At most a stop
    string's length less one can have been held back; anything longer means the
    decoding differs from the streamed text, and nothing is carried."""
    unsent = continuation_text[sent_chars:]
    longest = max((len(stop) for stop in stops), default=1) - 1
    return unsent if len(unsent) <= longest else ""
