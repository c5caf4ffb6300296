"""The block manager: allocation on block boundaries, freeing, contiguous reservation, usage figures."""
import pytest

from minibatch.engine.kv import BlockManager, blocks_for


def test_blocks_for_is_ceil_division():
    assert [blocks_for(n, 4) for n in (0, 1, 4, 5, 8, 9)] == [0, 1, 1, 2, 2, 3]


def test_paged_allocates_a_block_only_on_a_boundary():
    bm = BlockManager(num_blocks=10, block_size=4)
    assert bm.allocate(0, 3) == [0]
    assert bm.allocate(0, 4) == [0]
    assert bm.allocate(0, 5) == [0, 1]
    assert bm.slot(0, 4) == 1 * 4 + 0 and bm.slot(0, 3) == 3
    assert bm.usage()["tokens_stored"] == 5 and bm.usage()["tokens_reserved"] == 8
    assert bm.usage()["waste_fraction"] == pytest.approx(3 / 8)


def test_free_returns_blocks_and_they_are_reused():
    bm = BlockManager(num_blocks=3, block_size=2)
    bm.allocate(0, 4)
    bm.allocate(1, 2)
    assert not bm.can_allocate(2, 1)
    with pytest.raises(RuntimeError, match="out of KV blocks"):
        bm.allocate(2, 1)
    bm.free(0)
    assert bm.num_free_blocks == 2 and bm.allocate(2, 3) == [0, 1]
    bm.free(1)
    bm.free(2)
    assert bm.num_free_blocks == 3 and not bm.block_tables


def test_contiguous_reserves_max_model_len_up_front():
    bm = BlockManager(num_blocks=20, block_size=4, layout="contiguous", max_model_len=32)
    assert len(bm.allocate(0, 1)) == 8
    assert bm.allocate(0, 30) == bm.block_tables[0] and len(bm.block_tables[0]) == 8
    assert bm.usage()["waste_fraction"] == pytest.approx(1 - 30 / 32)
    assert bm.can_allocate(1, 1) and bm.allocate(1, 1) and not bm.can_allocate(2, 1)
