"""A request's output text as it grows, token by token: what may be sent yet, and where it stops.

Every step the whole output is decoded again (cheap for the short outputs served here) and the part
not sent yet becomes the next delta. Two things are held back until the next token: a trailing
replacement character (a multi-byte UTF-8 character is split across tokens), and the last
`len(longest stop string) - 1` characters, which might be the start of a stop string. So what is
streamed, joined, is exactly the text a non-streaming response carries.
"""
from __future__ import annotations


class TextStream:
    def __init__(self, stop: list[str]):
        self.stop = stop
        self.holdback = max((len(s) for s in stop), default=1) - 1   # characters that might begin a stop string
        self.sent = 0                                                 # characters already handed out
        self.text = ""

    def update(self, text: str, finished: bool) -> tuple[str, bool]:
        """Take the output decoded so far; return (new text to send, whether a stop string ended it)."""
        hits = [i for i in (text.find(s) for s in self.stop) if i >= 0]
        stopped = bool(hits)
        if stopped:
            text, finished = text[:min(hits)], True
        end = len(text)
        if not finished:
            end = max(self.sent, end - self.holdback)
            while end > self.sent and text[end - 1] == "\ufffd":
                end -= 1
        delta, self.sent, self.text = text[self.sent:end], end, text[:end]
        return delta, stopped
