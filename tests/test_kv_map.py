"""The KV-block map: block owners and fill per step, the map's pixels, the usage plot, the block-table
picture, and the two widgets driven headlessly; on hand-made records and on a simulated run of `tiny`."""

import matplotlib

matplotlib.use("Agg")

import numpy as np  # noqa: E402
import pytest  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

from minibatch import LLM, EngineConfig, SamplingParams, WorkloadRequest  # noqa: E402
from minibatch.engine.records import KVHolding  # noqa: E402
from minibatch.analysis.metrics import RunReport  # noqa: E402
from minibatch.engine.records import StepRecord
from minibatch.viz import block_owners, block_table_figure, kv_block_map, kv_usage, peak_step  # noqa: E402
from minibatch.viz.kv_map import FREE_COLOUR, RESERVED_ALPHA, grid_shape, owner_colour  # noqa: E402
from minibatch.widgets import BlockTableExplorer, KVMapScrubber  # noqa: E402


def step(index, holdings, num_blocks=6):
    return StepRecord(step=index, start=float(index), end=index + 1.0, batch_size=len(holdings), num_prefill_tokens=0,
                      num_decode_tokens=len(holdings), queue_depth=0,
                      kv_blocks_used=sum(len(h.blocks) for h in holdings.values()), kv_blocks_total=num_blocks,
                      idle_slots=0, num_preempted=0, kv_tokens_stored=sum(h.tokens for h in holdings.values()),
                      block_tables=holdings)


@pytest.fixture
def handmade():
    """Block size 4, six blocks. Step 1 is the busiest: request 7 holds 5 tokens in blocks 4 and 1."""
    steps = [step(0, {7: KVHolding(3, (4,))}),
             step(1, {7: KVHolding(5, (4, 1)), 2: KVHolding(4, (0,))}),
             step(2, {2: KVHolding(5, (0, 3))})]
    return RunReport(requests=[], steps=steps, max_batch_size=2)


def test_owners_and_fill(handmade):
    owner, filled = block_owners(handmade.steps[1], 6, 4)
    assert owner.tolist() == [2, 7, -1, -1, 7, -1]
    assert filled.tolist() == [4, 1, 0, 0, 4, 0]
    assert peak_step(handmade) == 1


def pixels(fig):
    return fig.axes[0].images[0].get_array()


def test_map_colours_stored_reserved_and_free(handmade):
    fig = kv_block_map(handmade, block_size=4, columns=3)
    assert isinstance(fig, Figure)
    image = pixels(fig)                                   # (2 rows, 3 blocks x 4 slots, RGBA)
    assert image.shape == (2, 12, 4)
    block = lambda b: image[b // 3, (b % 3) * 4:(b % 3 + 1) * 4]   # noqa: E731
    assert np.allclose(block(0), owner_colour(2))                         # full
    assert np.allclose(block(1)[0], owner_colour(7))                      # one token stored ...
    pale = 1 - RESERVED_ALPHA * (1 - np.array(owner_colour(7)))
    assert np.allclose(block(1)[1:], pale)                                  # ... three slots reserved, empty
    assert np.allclose(block(2), FREE_COLOUR) and np.allclose(block(5), FREE_COLOUR)
    title = fig.axes[0].get_title()
    assert title.startswith("step 1: 2 sequences hold 3 of 6 blocks") and "25% of their slots empty" in title
    assert kv_block_map(handmade, 4, step=0).axes[0].get_title().startswith("step 0: 1 sequences hold 1 of 6")
    with pytest.raises(ValueError, match="step=3 is not allowed: choose an index in 0..2"):
        kv_block_map(handmade, 4, step=3)


def test_owner_colours_are_strong_and_cycle():
    assert owner_colour(3) == owner_colour(12) != owner_colour(4)
    for i in range(9):                       # stored, reserved and free slots never look alike
        strong, pale = np.array(owner_colour(i)), 1 - RESERVED_ALPHA * (1 - np.array(owner_colour(i)))
        assert min(strong[:3]) < 0.5 and np.abs(pale - FREE_COLOUR).max() > 0.1


def test_grid_shape():
    assert grid_shape(6, 3) == (2, 3)
    assert grid_shape(113) == (11, 11)
    assert grid_shape(10) == (2, 8)


def test_usage_plots_reserved_and_stored(handmade):
    fig = kv_usage({"a": handmade, "b": handmade}, block_size=4)
    lines = fig.axes[0].get_lines()
    assert len(lines) == 4
    assert np.allclose(lines[0].get_ydata(), [4 / 24, 12 / 24, 8 / 24])     # reserved slots / all slots
    assert np.allclose(lines[1].get_ydata(), [3 / 24, 9 / 24, 5 / 24])     # tokens stored / all slots


def test_block_table_figure_names_the_slot():
    fig = block_table_figure([7, 2, 5, 11], context_len=27, block_size=8, num_blocks=16, position=20)
    assert fig.axes[0].get_title() == "position 20: logical block 2 -> physical block 5, offset 4 -> slot 44"
    with pytest.raises(ValueError, match="context_len=40 is not allowed"):
        block_table_figure([7, 2], context_len=40, block_size=8)
    with pytest.raises(ValueError, match="position=27 is not allowed: choose 0..26"):
        block_table_figure([7, 2, 5, 11], 27, 8, position=27)


@pytest.fixture(scope="module")
def runs():
    """The same six requests under both layouts, on the simulated clock (block size 8, 24 blocks)."""
    workload = [WorkloadRequest(0.0, [4 + i] * (9 + 3 * i), SamplingParams(max_new_tokens=12, ignore_eos=True))
                for i in range(6)]
    out = {}
    for layout in ("paged", "contiguous"):
        llm = LLM(EngineConfig(model="tiny", clock="simulated", sim_skip_model=True, max_batch_size=6, block_size=8,
                               num_kv_blocks=24, max_model_len=64, kv_layout=layout))
        out[layout] = llm.run(workload, use_tqdm=False)
    return out


def test_scrubber_starts_at_the_busiest_step_and_follows_the_slider(runs):
    panel = KVMapScrubber(runs, block_size=8)
    paged = runs["paged"]
    assert panel.step.value == peak_step(paged) and panel.step.max == len(paged.steps) - 1
    assert panel.caption.value.startswith(f"step {peak_step(paged)}: {len(paged.steps[peak_step(paged)].block_tables)} sequences")
    assert panel.image.value[:4] == b"\x89PNG"
    panel.step.value = 0
    assert panel.caption.value.startswith("step 0: ")
    owners = {int(o) for o in block_owners(paged.steps[0], 24, 8)[0] if o >= 0}
    assert owners == set(paged.steps[0].block_tables)
    panel.run.value = "contiguous"
    contiguous = runs["contiguous"]
    assert panel.step.max == len(contiguous.steps) - 1 and panel.step.value == peak_step(contiguous)
    assert "3 sequences hold 24 of 24 blocks" in panel.caption.value        # 64 tokens reserved = 8 blocks each
    assert panel.figure.axes[0].get_title() == kv_block_map(contiguous, 8, peak_step(contiguous)).axes[0].get_title()


def test_explorer_keeps_context_and_position_in_range():
    panel = BlockTableExplorer(context_len=40, block_size=8, num_blocks=16, seed=1)
    table = panel.block_table
    assert len(table) == 5 and len(set(table)) == 5
    assert panel.position.value == 39
    slot = table[39 // 8] * 8 + 39 % 8
    assert panel.caption.value.endswith(f"-> slot {table[4]} * 8 + 7 = {slot}")
    panel.size.value = 2                                   # the cache now holds 32 tokens: context and position shrink
    assert panel.context.value == 32 and panel.position.value == 31 and len(panel.block_table) == 16
    panel.position.value = 5
    assert f"position 5 -> table[5 // 2] = block {panel.block_table[2]}" in panel.caption.value
