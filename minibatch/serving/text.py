"""A request's output text as it grows, token by token: what may be sent yet, and where it stops.

The engine's `OutputDecoder` turns each step's new tokens into new text (holding back a multi-byte
character split across tokens until it completes). Here the last `len(longest stop string) - 1`
characters are held back until the next text arrives, since they might be the start of a stop
string. So what is streamed, joined, is exactly the text a non-streaming response carries, and each
step looks only at the new text and that short tail, never at the whole output again.
"""
from __future__ import annotations


class TextStream:
    def __init__(self, stop: list[str]):
        self.stop = stop
        self.holdback = max((len(s) for s in stop), default=1) - 1   # characters that might begin a stop string
        self.pending = ""                                             # text received and not sent yet

    def update(self, new_text: str, finished: bool) -> tuple[str, bool]:
        """Take the text the newest tokens decode to; return (text to send now, whether a stop string ended it).

        A stop string cannot begin in text already sent: that text was sent only once at least
        `holdback` characters followed it, and no stop string ended in it then."""
        self.pending += new_text
        stopped = first_stop(self.pending, self.stop)
        if stopped is not None:
            self.pending, finished = self.pending[:stopped], True
        end = len(self.pending) if finished else max(0, len(self.pending) - self.holdback)
        delta, self.pending = self.pending[:end], self.pending[end:]
        return delta, stopped is not None


def first_stop(text: str, stop: list[str]) -> int | None:
    """Where the text is cut: at the start of the stop string that *ends* first in it (as if it were
    checked after every character, so how the text arrived does not matter), or None."""
    hits = [(i + len(s), i) for s, i in ((s, text.find(s)) for s in stop) if i >= 0]
    return min(hits)[1] if hits else None
