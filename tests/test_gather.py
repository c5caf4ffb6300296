"""gather_rounds times the torch reference's gather, a copy of as many bytes and each CPU backend, interleaved."""
import pytest

from minibatch.bench.gather import COPY, GATHER, gather_rounds


def test_gather_rounds_names_every_figure_and_counts_the_bytes():
    rounds, gathered = gather_rounds(batch_size=2, context_len=40, rounds=3, block_size=16)
    assert gathered == 2 * 2 * 40 * 3 * 64 * 4     # K and V, 2 sequences x 40 tokens x 3 heads x 64 dims, fp32
    assert set(rounds.values) == {GATHER, COPY, "torch attention call (s)", "numba attention call (s)"}
    assert rounds.num_rounds == 3 and all(v > 0 for values in rounds.values.values() for v in values)


def test_fewer_rounds_than_a_claim_needs_is_an_error():
    with pytest.raises(ValueError, match="rounds=2"):
        gather_rounds(batch_size=1, context_len=16, rounds=2)
