"""The model runner: turns a step plan into packed tensors, runs the model, returns logits.

For every scheduled sequence it lays out the new tokens' ids and positions end to end (no
padding), the cache slot each new token is written to, and the attention metadata (where each
sequence's queries start, how long its context is, its block table). It never decides who runs.

The model computes the LM head only for the rows the runner lists: the last row of each sequence
that samples, and, for a request that asks for `prompt_logprobs`, every prompt row this step
computes (`scored_positions`), listed after all the sampling rows, so a step where nobody asks
costs nothing more.
"""
from __future__ import annotations

import numpy as np
import torch

from minibatch.engine.kernels import AttentionMetadata
from minibatch.engine.kv import BlockManager, KVCache
from minibatch.engine.models.llama import LlamaModel
from minibatch.engine.sampling import score_tokens
from minibatch.engine.schedulers import ScheduledSeq, StepPlan


def scored_positions(seq: ScheduledSeq) -> range:
    """Positions of this step whose logits score the prompt's next token (`SamplingParams.prompt_logprobs`): row p
    gives the log-probabilities of prompt token p + 1. A request that asks scores each position once, in order, as
    chunked prefill reaches it (a recomputation after preemption scores nothing twice); one whose prompt rows were
    skipped (a cached prefix reused) cannot be scored, and says so."""
    request = seq.request
    if request.prompt_logprobs is None:
        return range(0)
    next_position = len(request.prompt_logprobs) - 1                 # the position that scores the next token
    end = min(seq.start + seq.num_new_tokens, len(request.prompt_token_ids) - 1)
    if next_position < end and seq.start > next_position:
        raise RuntimeError(f"request {request.request_id} asks for prompt_logprobs but computes from position "
                           f"{seq.start}, past {next_position}, the next one to score: a scheduler must not reuse "
                           "cached prefix blocks for it (Scheduler.cached_prefix)")
    return range(max(seq.start, next_position), end)


def keep_prompt_logprobs(plan: StepPlan, logits: torch.Tensor | None) -> torch.Tensor | None:
    """After a step: append to each asking request's `prompt_logprobs` what its rows scored (they follow the
    sampling rows, see `ModelRunner.prepare`) and return the sampling rows alone; nobody asking costs nothing."""
    scored = [(s.request, scored_positions(s)) for s in plan.seqs if s.request.prompt_logprobs is not None]
    count = sum(len(positions) for _, positions in scored)
    if not count:
        return logits
    first = len(logits) - count
    for request, positions in scored:
        targets = [request.prompt_token_ids[p + 1] for p in positions]      # row p scores token p + 1
        dicts, ranks = score_tokens(logits[first:first + len(positions)], targets, request.params.prompt_logprobs)
        request.prompt_logprobs.extend(dicts)
        request.prompt_token_ranks.extend(ranks)
        first += len(positions)
    return logits[:len(logits) - count]


class ModelRunner:
    def __init__(self, model: LlamaModel, kv_cache: KVCache, blocks: BlockManager, device):
        self.model, self.kv_cache, self.blocks, self.device = model, kv_cache, blocks, device

    def prepare(self, plan: StepPlan):
        """Packed inputs of a step: ids, positions, slots (T,), metadata, and the rows that sample.

        A sequence with draft tokens (speculative decoding) runs them after its own new tokens and
        gets a logits row for its last token and for each draft token: the k + 1 rows verification reads.
        The rows that score prompt tokens (`scored_positions`) come after all of those, in plan order.
        """
        ids, positions, slots, query_lens, context_lens, tables, logits_rows = [], [], [], [], [], [], []
        prompt_rows = []
        for seq in plan.seqs:
            r, start, drafts = seq.request, seq.start, seq.draft_token_ids
            n = seq.num_new_tokens + len(drafts)
            table = self.blocks.block_tables[r.request_id]
            prompt_rows.extend(len(ids) + p - start for p in scored_positions(seq))
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
        logits_rows.extend(prompt_rows)
        to_device = lambda a: torch.from_numpy(np.ascontiguousarray(a, dtype=np.int64)).to(self.device)
        meta = AttentionMetadata.build(query_lens, context_lens, tables, self.device)
        meta.cache["request_ids"] = [s.request.request_id for s in plan.seqs]   # for messages about a sequence
        return (to_device(ids), to_device(np.concatenate(positions)), to_device(np.concatenate(slots)),
                meta, to_device(logits_rows))

    @torch.inference_mode()
    def execute(self, plan: StepPlan) -> torch.Tensor:
        """Run one step; returns logits (S, V) for the sequences that sample (plus their draft rows), in plan order,
        then a row per scored prompt position (`scored_positions`)."""
        input_ids, positions, slot_mapping, meta, logits_rows = self.prepare(plan)
        return self.model.forward(input_ids, positions, slot_mapping, meta, self.kv_cache, logits_rows)
