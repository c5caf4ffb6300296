"""The model runner: turns a step plan into packed tensors, runs the model, returns logits.

For every scheduled sequence it lays out the new tokens' ids and positions end to end (no
padding), the cache slot each new token is written to, and the attention metadata (where each
sequence's queries start, how long its context is, its block table). It never decides who runs.
"""
from __future__ import annotations

import numpy as np
import torch

from minibatch.engine.kernels import AttentionMetadata
from minibatch.engine.kv import BlockManager, KVCache
from minibatch.engine.models.llama import LlamaModel
from minibatch.engine.schedulers import StepPlan


class ModelRunner:
    def __init__(self, model: LlamaModel, kv_cache: KVCache, blocks: BlockManager, device):
        self.model, self.kv_cache, self.blocks, self.device = model, kv_cache, blocks, device

    def prepare(self, plan: StepPlan):
        """Packed inputs of a step: ids, positions, slots (T,), metadata, and the rows that sample.

        A sequence with draft tokens (speculative decoding) runs them after its own new tokens and
        gets a logits row for its last token and for each draft token: the k + 1 rows verification reads.
        """
        ids, positions, slots, query_lens, context_lens, tables, logits_rows = [], [], [], [], [], [], []
        for seq in plan.seqs:
            r, start, drafts = seq.request, seq.start, seq.draft_token_ids
            n = seq.num_new_tokens + len(drafts)
            table = self.blocks.block_tables[r.request_id]
            ids.extend(r.all_token_ids[start:start + seq.num_new_tokens])
            ids.extend(drafts)
            pos = np.arange(start, start + n)
            positions.append(pos)
            slots.append(self.blocks.slots(r.request_id, pos))
            query_lens.append(n)
            context_lens.append(start + n)
            tables.append(table)
            if seq.samples:
                logits_rows.extend(range(len(ids) - 1 - len(drafts), len(ids)))
        to_device = lambda a: torch.from_numpy(np.ascontiguousarray(a, dtype=np.int64)).to(self.device)
        meta = AttentionMetadata.build(query_lens, context_lens, tables, self.device)
        meta.cache["request_ids"] = [s.request.request_id for s in plan.seqs]   # for messages about a sequence
        return (to_device(ids), to_device(np.concatenate(positions)), to_device(np.concatenate(slots)),
                meta, to_device(logits_rows))

    @torch.inference_mode()
    def execute(self, plan: StepPlan) -> torch.Tensor:
        """Run one step; returns logits (S, V) for the sequences that sample (plus their draft rows), in plan order."""
        input_ids, positions, slot_mapping, meta, logits_rows = self.prepare(plan)
        return self.model.forward(input_ids, positions, slot_mapping, meta, self.kv_cache, logits_rows)
