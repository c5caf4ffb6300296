"""Streamed output text: the engine's incremental decoder and the server's stop-string holdback give,
joined, exactly the text of decoding the whole output at once, however the tokens arrive."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers import AutoTokenizer

from minibatch.engine.models.smollm2 import prepare_default_model
from minibatch.engine.models.tiny import tiny_tokenizer
from minibatch.engine.tokens import PromptEncoder
from minibatch.serving.text import TextStream

TOKENIZERS = {"tiny": tiny_tokenizer(), "smollm2": AutoTokenizer.from_pretrained(prepare_default_model())}
# text whose tokens split multi-byte characters (accents, CJK, emoji) across token boundaries
MIXED = "héllo wörld, 你好 🙂 naïve café\n" * 3


def token_ids(name: str):
    tokenizer = TOKENIZERS[name]
    encoded = tokenizer.encode(MIXED, add_special_tokens=False)
    return st.one_of(st.lists(st.integers(0, len(tokenizer) - 1), min_size=1, max_size=30),   # any ids at all
                     st.integers(1, len(encoded)).map(lambda n: encoded[:n]))                  # real text, cut anywhere


def cuts(items, points: list[int]) -> list:
    """items (token ids or text) in the consecutive pieces a run of steps would deliver (several tokens a
    step when speculating)."""
    bounds = sorted({0, len(items), *(p % (len(items) + 1) for p in points)})
    return [items[a:b] for a, b in zip(bounds, bounds[1:])]


@pytest.mark.parametrize("name", TOKENIZERS)
@settings(max_examples=60, deadline=None)
@given(data=st.data(), points=st.lists(st.integers(0, 100), max_size=6))
def test_pushed_text_joined_is_the_whole_decode(name, data, points):
    ids = data.draw(token_ids(name))
    prompts = PromptEncoder(TOKENIZERS[name], len(TOKENIZERS[name]), 2048)
    decoder = prompts.output_decoder()
    streamed = "".join(decoder.push(piece) for piece in cuts(ids, points)) + decoder.finish()
    assert streamed == prompts.decode(ids)


@settings(max_examples=80, deadline=None)
@given(text=st.text(alphabet="abc 🙂", max_size=40), stop=st.lists(st.text(alphabet="abc🙂", min_size=1, max_size=4),
       max_size=3), points=st.lists(st.integers(0, 40), max_size=6))
def test_stop_strings_end_the_stream_where_the_whole_text_would(text, stop, points):
    stream = TextStream(stop)
    pieces = cuts(text, points) or [""]
    sent, stopped = "", False
    for i, piece in enumerate(pieces):
        delta, stopped = stream.update(piece, finished=i == len(pieces) - 1)
        sent += delta
        if stopped:
            break
    ends = [(text.index(s) + len(s), text.index(s)) for s in stop if s in text]   # the stop string that ends first
    assert stopped == bool(ends)
    assert sent == (text[:min(ends)[1]] if ends else text)


def test_a_token_that_splits_a_character_waits_for_the_rest():
    prompts = PromptEncoder(TOKENIZERS["tiny"], len(TOKENIZERS["tiny"]), 2048)
    emoji = TOKENIZERS["tiny"].encode("🙂", add_special_tokens=False)         # four byte tokens
    decoder = prompts.output_decoder()
    assert [decoder.push([t]) for t in emoji] == ["", "", "", "🙂"]
    cut_short = prompts.output_decoder()
    assert cut_short.push(emoji[:2]) == "" and cut_short.finish() == prompts.decode(emoji[:2]) != ""
