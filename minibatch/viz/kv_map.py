"""The KV-block map: every block of the cache at one step, coloured by the request that owns it.

The cache is drawn as a grid of blocks, block 0 at the top left, `columns` blocks per row. Each
block is a strip of `block_size` token slots: a slot holding a token has its owner's colour
(nine strong hues, in turn), a slot its owner reserved but has not filled is a pale shade of that
colour (the waste: the tail of a last block, or a whole contiguous reservation), and a free block
is white. With prefix caching, a block in several tables (a shared prefix) carries a black dot, and
a cached block nobody holds (kept for reuse, evictable) is grey. Everything is read from
`StepRecord.block_tables` (request id -> `KVHolding(tokens, blocks)`) and `StepRecord.cached_blocks`,
so any recorded run, measured or simulated, can be drawn at any step. `kv_usage` draws the same records over the whole run; `block_table_figure`
draws how one sequence's logical positions land in physical blocks.
"""
from __future__ import annotations

import math

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.patches import Patch

FREE_COLOUR = (1.0, 1.0, 1.0, 1.0)      # a free block: white, inside the grey block borders
CACHED_COLOUR = (0.8, 0.8, 0.8, 1.0)    # a cached block nobody holds (prefix caching): grey, kept for reuse
CACHED = -2                             # block_owners' owner of such a block (free is -1)
RESERVED_ALPHA = 0.3                    # how pale a reserved but empty slot is
OWNER_COLOURS = [plt.get_cmap("tab10")(i) for i in range(10) if i != 7]   # tab10 less its grey, too close to pale shades


def owner_colour(request_id: int):
    """A strong colour per request (cycling), so a pale shade can only mean reserved and empty."""
    return OWNER_COLOURS[request_id % len(OWNER_COLOURS)]


def block_owners(step, num_blocks: int, block_size: int) -> tuple[np.ndarray, np.ndarray]:
    """(owner, filled): per block, the request id holding it (-1: free, CACHED: cached and held by nobody)
    and how many tokens it holds (a shared block: its last holder's)."""
    owner = np.full(num_blocks, -1, dtype=np.int64)
    filled = np.zeros(num_blocks, dtype=np.int64)
    cached = list(step.cached_blocks)
    owner[cached], filled[cached] = CACHED, block_size
    for request_id, (tokens, blocks) in step.block_tables.items():
        for index, block in enumerate(blocks):
            owner[block] = request_id
            filled[block] = min(block_size, max(0, tokens - index * block_size))  # tokens in this block
    return owner, filled


def shared_blocks(step) -> list[int]:
    """Blocks held by more than one request at this step (a prefix they share), in block order."""
    held = np.asarray([b for _, blocks in step.block_tables.values() for b in blocks], dtype=np.int64)
    counts = np.bincount(held, minlength=1)
    return np.flatnonzero(counts > 1).tolist()


def peak_step(report) -> int:
    """Index of the step that held the most blocks (the first, if several)."""
    return int(np.argmax([s.kv_blocks_used for s in report.steps]))


def step_usage(step, block_size: int) -> dict:
    """Blocks used, sequences holding blocks, tokens stored, slots reserved and the waste at one step."""
    reserved = step.kv_blocks_used * block_size
    return {"blocks_used": step.kv_blocks_used, "blocks_total": step.kv_blocks_total, "seqs": len(step.block_tables),
            "tokens_stored": step.kv_tokens_stored, "tokens_reserved": reserved,
            "waste_fraction": 1 - step.kv_tokens_stored / reserved if reserved else 0.0}


def grid_shape(num_blocks: int, columns: int | None = None) -> tuple[int, int]:
    """(rows, columns) of the map: `columns` blocks a row, or about as many rows as columns (at least 8 a row)."""
    columns = columns or max(8, math.ceil(math.sqrt(num_blocks)))
    return math.ceil(num_blocks / columns), columns


def kv_block_map(report, block_size: int, step: int | None = None, columns: int | None = None, ax=None,
                 title: str | None = None):
    """Draw the cache's blocks at one step of a run; returns the Figure.

    report: a `RunReport`; block_size: tokens per block (`llm.config.block_size`); step: index
    into `report.steps` (None: the step that held the most blocks); columns: blocks per row (None:
    about as many rows as columns, at least 8 blocks a row); ax: draw into this Axes.
    """
    if not report.steps:
        raise ValueError("report has no steps: run a workload first")
    index = peak_step(report) if step is None else step
    if not -len(report.steps) <= index < len(report.steps):
        raise ValueError(f"step={step!r} is not allowed: choose an index in 0..{len(report.steps) - 1}")
    record = report.steps[index]
    num_blocks = record.kv_blocks_total
    rows, columns = grid_shape(num_blocks, columns)
    owner, filled = block_owners(record, num_blocks, block_size)
    image = np.zeros((rows, columns * block_size, 4))                  # (rows, token slots per row, RGBA); transparent past the last block
    for block in range(num_blocks):
        r, c = divmod(block, columns)
        strip = image[r, c * block_size:(c + 1) * block_size]           # (block_size, 4)
        if owner[block] < 0:
            strip[:] = CACHED_COLOUR if owner[block] == CACHED else FREE_COLOUR
            continue
        colour = np.array(owner_colour(int(owner[block])))
        strip[:] = 1 - RESERVED_ALPHA * (1 - colour)                    # pale: reserved, no token yet
        strip[:filled[block]] = colour
    if ax is None:
        _, ax = plt.subplots(figsize=(10, 0.32 * rows + 1.4), layout="constrained")
    ax.imshow(image, aspect="auto", interpolation="nearest", extent=(0, columns, rows, 0))
    ax.set_xticks(np.arange(columns + 1), minor=True)
    ax.set_yticks(np.arange(rows + 1), minor=True)
    ax.grid(which="minor", color="#bbbbbb", linewidth=0.8)             # the block borders
    ax.tick_params(which="minor", length=0)
    ax.set_xticks([])
    ax.set_yticks(np.arange(rows) + 0.5, [str(r * columns) for r in range(rows)], fontsize=7)
    ax.set_ylabel("first block of the row")
    shared = shared_blocks(record)
    if shared:
        rows_of, columns_of = np.divmod(np.array(shared), columns)
        ax.scatter(columns_of + 0.5, rows_of + 0.5, s=14, color="black", zorder=3)
    usage = step_usage(record, block_size)
    sharing = f"; {len(shared)} shared, {len(record.cached_blocks)} cached" if shared or record.cached_blocks else ""
    ax.set_title(title or f"step {index % len(report.steps)}: {usage['seqs']} sequences hold {usage['blocks_used']} of "
                          f"{num_blocks} blocks; {usage['waste_fraction']:.0%} of their slots empty{sharing}")
    legend = [Patch(facecolor="tab:blue", label="token stored"),
              Patch(facecolor="tab:blue", alpha=RESERVED_ALPHA, label="reserved, empty"),
              Patch(facecolor=FREE_COLOUR, edgecolor="#bbbbbb", label="free block")]
    if sharing:
        legend += [Patch(facecolor=CACHED_COLOUR, label="cached, nobody holds it"),
                   plt.Line2D([], [], marker="o", color="black", linestyle="", markersize=4, label="shared block")]
    ax.legend(handles=legend, loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8, frameon=False)
    return ax.figure


def kv_usage(reports, block_size: int, ax=None, title: str | None = None):
    """Token slots reserved (solid) and tokens stored (dashed) at every step, as a share of the cache,
    for one `RunReport` or a dict {name: RunReport}; returns the Figure."""
    reports = reports if isinstance(reports, dict) else {"run": reports}
    if ax is None:
        _, ax = plt.subplots(figsize=(10, 3.2), layout="constrained")
    for i, (name, report) in enumerate(reports.items()):
        colour = f"C{i}"
        total = [s.kv_blocks_total * block_size for s in report.steps]
        reserved = [s.kv_blocks_used * block_size / t for s, t in zip(report.steps, total)]
        stored = [s.kv_tokens_stored / t for s, t in zip(report.steps, total)]
        ax.plot(reserved, color=colour, label=f"{name}: reserved")
        ax.plot(stored, color=colour, linestyle="--", label=f"{name}: tokens stored")
        ax.fill_between(range(len(stored)), stored, reserved, color=colour, alpha=0.15)
    ax.set_ylim(0, 1.05)
    ax.set_xlabel("step")
    ax.set_ylabel("share of the KV cache")
    ax.set_title(title or "KV cache over a run: the shaded gap between reserved and stored is waste")
    ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8, frameon=False)
    return ax.figure


def block_table_figure(block_table, context_len: int, block_size: int, num_blocks: int | None = None,
                       position: int | None = None, ax=None):
    """One sequence: its logical blocks (top row) and where they sit in the physical cache (bottom
    row), with a line from each logical block to its physical block; `position` marks one token."""
    block_table = list(block_table)
    needed = -(-context_len // block_size)
    if context_len < 0 or needed > len(block_table):
        raise ValueError(f"context_len={context_len} is not allowed: the block table holds "
                         f"{len(block_table)} blocks of {block_size} tokens, so 0..{len(block_table) * block_size}")
    if position is not None and not 0 <= position < context_len:
        raise ValueError(f"position={position} is not allowed: choose 0..{context_len - 1}")
    num_blocks = num_blocks or max(block_table) + 1
    if ax is None:
        _, ax = plt.subplots(figsize=(10, 2.8), layout="constrained")
    scale = num_blocks / max(needed, 1)                 # logical blocks are drawn wider, to span the same width
    for i in range(needed):
        tokens = min(block_size, context_len - i * block_size)
        ax.add_patch(plt.Rectangle((i * scale, 1.6), scale * tokens / block_size, 0.6, color=owner_colour(i)))
        ax.add_patch(plt.Rectangle((i * scale, 1.6), scale, 0.6, fill=False, edgecolor="black", linewidth=0.5))
        ax.text((i + 0.5) * scale, 1.9, f"{i * block_size}..{i * block_size + tokens - 1}", ha="center", va="center", fontsize=7)
        physical = block_table[i]
        ax.add_patch(plt.Rectangle((physical, 0), tokens / block_size, 0.6, color=owner_colour(i)))
        ax.plot([(i + 0.5) * scale, physical + 0.5], [1.6, 0.6], color="grey", linewidth=0.8)
    for b in range(num_blocks):
        ax.add_patch(plt.Rectangle((b, 0), 1, 0.6, fill=False, edgecolor="#999999", linewidth=0.5))
    if position is not None:
        block, offset = block_table[position // block_size], position % block_size
        top, bottom = (position + 0.5) / block_size * scale, block + (offset + 0.5) / block_size  # the token's x in each row
        ax.plot([top, top, bottom, bottom], [2.2, 1.6, 0.6, 0.0], color="black", linewidth=1.5)
        ax.set_title(f"position {position}: logical block {position // block_size} -> physical block {block}, "
                     f"offset {offset} -> slot {block * block_size + offset}")
    else:
        ax.set_title(f"block table {block_table[:needed]}: logical blocks (top) live anywhere in the cache (bottom)")
    ax.set_xlim(0, num_blocks)
    ax.set_ylim(-0.2, 2.4)
    ax.set_yticks([0.3, 1.9], ["physical\nblocks", "sequence\n(positions)"])
    ax.set_xticks(np.arange(num_blocks) + 0.5, [str(b) for b in range(num_blocks)], fontsize=7)
    return ax.figure
