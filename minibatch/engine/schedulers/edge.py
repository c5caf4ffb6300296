"""Edge mode: one user at a time, in arrival order, with no batching wait (latency first).

This is continuous batching with a batch of one and no timeout: what an on-device assistant does,
where there is one user and the hardware is a phone or a laptop.
"""
from __future__ import annotations

from minibatch.config import EngineConfig
from minibatch.engine.kv import BlockManager
from minibatch.engine.schedulers.continuous import ContinuousScheduler


class EdgeScheduler(ContinuousScheduler):
    """Continuous batching on one slot (`EngineConfig.batch_slots` is 1 in edge mode) that never waits."""

    def __init__(self, config: EngineConfig, block_manager: BlockManager):
        super().__init__(config, block_manager)
        self.batch_timeout_s = 0.0                   # one user: nothing to wait for
