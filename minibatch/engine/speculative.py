"""Speculative decoding: guess k tokens cheaply, then check all of them in one pass of the model.

A decode step of a small model does little arithmetic and pays for everything else (reading the
weights, launching work, Python), so checking k + 1 tokens costs about what producing one does.
A *proposer* guesses k draft tokens; the model runs the sequence's newest token and the k drafts
in one forward pass over the paged cache (k + 1 logits rows) and keeps the drafts it agrees with,
plus one token of its own. A step yields 1 to k + 1 tokens, and they are the model's own.

Proposers:
- "ngram" (prompt lookup): find an earlier occurrence of the sequence's last n tokens in its prompt
  and output, and propose what followed it. No second model; it shines when the output copies
  from the input (editing, summarising, extracting).
- "draft": a smaller model with the same tokenizer, with its own KV tensors; it reuses the
  target's block tables, so a token's slot is the same in both caches.
- "layer_skip": the first layers of the model itself, then its final norm and LM head. Its cache
  is the model's own first layers, which the verification pass writes anyway.

How many drafts: with `EngineConfig.speculative_adaptive` (the default) a `DraftPolicy` gives each
request the number of drafts that pays on its own acceptance rate and the measured cost of a verify
step, none where drafting would slow it down (see `minibatch.engine.draft_policy`); without it,
every decoding sequence drafts k. Greedy tokens are the same either way. A sampled request always
drafts k: how many drafts it proposes decides how its random stream is spent, and a number that
followed measured step times would break the promise that a seed gives the same sample.

Verification: greedy keeps drafts while they equal the model's argmax (`verify_greedy`); sampling
uses the rejection rule of Leviathan et al. and Chen et al. (2023) (`verify_sampled`), so tokens
follow the model's own distribution p whatever the draft's q. KV slots written for rejected
drafts are rolled back: num_computed_tokens counts accepted tokens only, and blocks past them are
released.
"""
from __future__ import annotations

import numpy as np
import torch

from minibatch.config import ConfigError
from minibatch.engine.draft_policy import DraftPolicy, expected_tokens_per_step  # noqa: F401 (its public home)
from minibatch.engine.kernels import AttentionMetadata
from minibatch.engine.kv import KVCache
from minibatch.engine.models import load_model
from minibatch.engine.models.llama import LlamaModel
from minibatch.engine.sampling import PlainDecoder, filter_logits, most_likely


def ngram_propose(token_ids: list[int], k: int, n_max: int, n_min: int) -> list[int]:
    """Prompt lookup: for n from n_max down to n_min, find the latest earlier occurrence of the last n
    tokens and return up to k tokens that followed it; [] when no suffix recurs."""
    tokens = np.asarray(token_ids)
    for n in range(min(n_max, len(tokens) - 1), n_min - 1, -1):
        windows = np.lib.stride_tricks.sliding_window_view(tokens[:-1], n)  # (L - n, n): every earlier n-gram
        hits = np.flatnonzero((windows == tokens[-n:]).all(axis=1))
        if len(hits):
            follow = hits[-1] + n
            return [int(t) for t in tokens[follow:follow + k]]
    return []


def verify_greedy(draft_token_ids: list[int], target_token_ids: list[int]) -> list[int]:
    """Greedy verification: target_token_ids (k + 1) are the model's argmax after the newest token and
    after each draft. Keep drafts while they match, then add the model's own token where they stop."""
    n = 0
    while n < len(draft_token_ids) and draft_token_ids[n] == target_token_ids[n]:
        n += 1
    return list(draft_token_ids[:n]) + [target_token_ids[n]]


def verify_sampled(draft_token_ids, target_probs, draft_probs, generator) -> list[int]:
    """Rejection sampling: target_probs (k + 1, V) is p at each position, draft_probs (k, V) the q the
    drafts were drawn from (None: drafts were fixed guesses, q one-hot). Draft d is accepted with
    probability min(1, p(d) / q(d)); the first rejected one is replaced by a draw from max(0, p - q)."""
    out = []
    for i, token in enumerate(draft_token_ids):
        p = target_probs[i]                                               # (V,)
        q = draft_probs[i] if draft_probs is not None else torch.nn.functional.one_hot(
            torch.tensor(token), p.shape[-1]).to(p.dtype)                 # (V,)
        if torch.rand((), generator=generator) * q[token] < p[token]:
            out.append(token)
            continue
        residual = (p - q).clamp(min=0)                                   # (V,) mass p has and q lacks
        return out + [int(torch.multinomial(residual, 1, generator=generator))]
    return out + [int(torch.multinomial(target_probs[len(draft_token_ids)], 1, generator=generator))]


class NgramProposer:
    """Drafts copied from earlier in each sequence (prompt lookup); no model runs."""

    def __init__(self, n_max: int, n_min: int):
        self.n_max, self.n_min = n_max, n_min

    def propose(self, seqs, ks, sampler):
        """Up to ks[i] drafts for seqs[i]: what followed the latest earlier match of its last tokens."""
        drafts = [ngram_propose(s.request.all_token_ids, k, self.n_max, self.n_min) for s, k in zip(seqs, ks)]
        return drafts, [None] * len(seqs)

    def rewind(self, request_id: int, num_tokens: int) -> None:
        pass                                                              # nothing cached

    def release(self, request_id: int) -> None:
        pass


class ModelProposer:
    """Drafts from a model (a smaller one, or the first layers of the target), all sequences batched.

    Each sequence first feeds the tokens its draft cache lacks, then one draft token per pass.
    """

    def __init__(self, model: LlamaModel, kv_cache: KVCache, blocks, device, num_layers=None):
        self.model, self.kv_cache, self.blocks, self.device = model, kv_cache, blocks, device
        self.num_layers = num_layers                # layer_skip: the target's first layers (its own cache)
        self.computed: dict[int, int] = {}          # request id -> leading tokens whose K/V the draft holds

    def rewind(self, request_id: int, num_tokens: int) -> None:
        """Forget draft K/V past num_tokens (rejected drafts, or a preempted request starting over)."""
        self.computed[request_id] = min(self.computed.get(request_id, 0), num_tokens)

    def release(self, request_id: int) -> None:
        self.computed.pop(request_id, None)

    @torch.inference_mode()
    def propose(self, seqs, ks, sampler):
        """ks[i] drafts for seqs[i], one pass per draft position, the sequences still drafting batched."""
        starts, feeds = [], []
        for seq in seqs:
            r = seq.request
            start = r.num_computed_tokens if self.num_layers else self.computed.get(r.request_id, 0)
            starts.append(start)
            feeds.append(r.all_token_ids[start:])
        drafts, probs = [[] for _ in seqs], [[] for _ in seqs]
        for _ in range(max(ks)):
            active = [i for i, k in enumerate(ks) if len(drafts[i]) < k]
            logits = self._forward([seqs[i].request.request_id for i in active],
                                   [feeds[i] for i in active], [starts[i] for i in active])  # (len(active), V)
            for row, i in enumerate(active):
                token, q = self._pick(logits[row], seqs[i].request, sampler)
                drafts[i].append(token)
                probs[i].append(q)
                starts[i] += len(feeds[i])
                feeds[i] = [token]
        for seq, start in zip(seqs, starts):
            self.computed[seq.request.request_id] = start
        return drafts, [None if q[0] is None else torch.stack(q) for q in probs]

    def _pick(self, logits, request, sampler):
        """The draft token from one row of logits (V,), and the distribution q it was drawn from."""
        if request.params.greedy:
            return most_likely(logits[None])[0], None
        q = filter_logits(logits.float().cpu(), request.params).softmax(-1)   # (V,)
        return int(torch.multinomial(q, 1, generator=sampler.generator(request.request_id, request.params))), q

    def _forward(self, request_ids, feeds, starts):
        """Packed forward of each sequence's fed tokens; logits (B, V) of each sequence's last one."""
        lens = [len(f) for f in feeds]
        positions = np.concatenate([np.arange(s, s + n) for s, n in zip(starts, lens)])  # (T,)
        tables = [self.blocks.block_tables[rid] for rid in request_ids]
        slots = np.concatenate([self.blocks.slots(rid, np.arange(s, s + n))
                                for rid, s, n in zip(request_ids, starts, lens)])         # (T,)
        meta = AttentionMetadata.build(lens, [s + n for s, n in zip(starts, lens)], tables, self.device)
        as_tensor = lambda a: torch.as_tensor(np.asarray(a, dtype=np.int64), device=self.device)
        ids = as_tensor([t for f in feeds for t in f])
        return self.model.forward(ids, as_tensor(positions), as_tensor(slots), meta, self.kv_cache,
                                  as_tensor(np.cumsum(lens) - 1), num_layers=self.num_layers)


class Speculator:
    """The speculative decoder: proposes drafts for a step's decoding sequences, verifies them, and rolls
    back the rejected (the same four calls as `minibatch.engine.sampling.PlainDecoder`)."""

    drafts = True                                   # propose is a phase of the step

    def __init__(self, proposer, blocks, sampler, policy: DraftPolicy | None = None):
        self.proposer, self.blocks, self.sampler = proposer, blocks, sampler
        self.policy = policy                        # how many drafts pay per request; None: always all k
        self.draft_probs: dict[int, torch.Tensor | None] = {}  # request id -> q (k, V) of this step's drafts

    def propose(self, plan) -> None:
        """Fill draft_token_ids of every sequence the scheduler reserved lookahead slots for, as many as
        the policy says pay (a sequence given none runs exactly as in plain decoding)."""
        for seq in plan.seqs:                      # a preempted request recomputes from 0: so must its draft
            self.proposer.rewind(seq.request.request_id, seq.start)
        batch = sum(1 for s in plan.seqs if not s.is_prefill)
        wanted = [(s, self._num_drafts(s, batch)) for s in plan.seqs if s.num_lookahead]
        seqs, ks = [s for s, k in wanted if k], [k for _, k in wanted if k]
        self.draft_probs.clear()
        if seqs:
            drafts, probs = self.proposer.propose(seqs, ks, self.sampler)
            for seq, d, q in zip(seqs, drafts, probs):
                seq.draft_token_ids = d
                self.draft_probs[seq.request.request_id] = q

    def _num_drafts(self, seq, batch: int) -> int:
        if self.policy is None or not seq.request.params.greedy:    # a seeded sample must repeat exactly
            return seq.num_lookahead
        return self.policy.num_drafts(seq.request.request_id, batch, room=seq.num_lookahead)

    def observe_step(self, record, finished) -> None:
        """After every step (an engine step observer): a decode step's rows and duration teach the policy
        what a verify step costs on this machine."""
        if self.policy is not None and record.num_prefill_tokens == 0:
            rows = record.num_decode_tokens + sum(drafted for drafted, _ in record.spec_outcomes)
            self.policy.observe_step(rows, record.duration)

    def choose(self, logits, plan) -> tuple[list[list[int]], list[None], list[tuple[int, int]]]:
        """logits (rows, V): 1 + len(drafts) rows per sampling sequence. Returns the tokens each one
        produced, no log-probabilities (the engine refuses `logprobs` when speculating), and
        (drafted, accepted) for each sequence that had drafts."""
        greedy_rows = most_likely(logits)
        outputs, outcomes, row = [], [], 0
        for seq in (s for s in plan.seqs if s.samples):
            r, drafts = seq.request, seq.draft_token_ids
            rows = slice(row, row + len(drafts) + 1)
            row = rows.stop
            if r.params.greedy:
                tokens = verify_greedy(drafts, greedy_rows[rows])
            else:
                p = torch.stack([filter_logits(x.float().cpu(), r.params).softmax(-1) for x in logits[rows]])
                tokens = verify_sampled(drafts, p, self.draft_probs.get(r.request_id),
                                        self.sampler.generator(r.request_id, r.params))
            outputs.append(tokens)
            if drafts:
                outcomes.append((len(drafts), len(tokens) - 1))
                if self.policy is not None:
                    self.policy.observe_outcome(r.request_id, len(drafts), len(tokens) - 1)
        return outputs, [None] * len(outputs), outcomes

    def rewind(self, plan) -> None:
        """After the update: release blocks reserved past each speculating sequence's accepted tokens."""
        for seq in plan.seqs:
            if seq.num_lookahead and not seq.request.is_finished:
                self.blocks.shrink(seq.request.request_id, seq.request.num_computed_tokens)
                self.proposer.rewind(seq.request.request_id, seq.request.num_computed_tokens)

    def release(self, request_id: int) -> None:
        self.proposer.release(request_id)
        self.sampler.release(request_id)
        if self.policy is not None:
            self.policy.release(request_id)


def make_decoder(config, sampler, model, kv_cache, blocks, device, dtype, max_model_len):
    """The decoder a config asks for: plain sampling, or a Speculator with its proposer (checking that
    a draft fits the target `model`, whose `kv_cache` a layer-skip draft shares)."""
    method = config.speculative_method
    if method is None:
        return PlainDecoder(sampler)
    if method == "ngram":
        proposer = NgramProposer(config.ngram_prompt_lookup_max, config.ngram_prompt_lookup_min)
    elif method == "layer_skip":
        layers = config.speculative_layers or model.num_layers // 2
        if layers >= model.num_layers:
            raise ConfigError(f"EngineConfig.speculative_layers={layers} is not allowed: the draft must skip "
                              f"some of the model's {model.num_layers} layers (1 to {model.num_layers - 1})")
        proposer = ModelProposer(model, kv_cache, blocks, device, layers)
    else:
        draft = LlamaModel(load_model(config.speculative_model), model.ops, dtype, device, max_model_len)
        if draft.vocab_size != model.vocab_size:
            raise ConfigError(f"EngineConfig.speculative_model={config.speculative_model!r} is not allowed: its "
                              f"vocabulary has {draft.vocab_size} tokens, the model's {model.vocab_size}; "
                              "the draft needs the same tokenizer")
        cache = KVCache(draft.num_layers, blocks.num_blocks, blocks.block_size, draft.num_kv_heads,
                        draft.head_dim, dtype, device)
        proposer = ModelProposer(draft, cache, blocks, device)
    policy = DraftPolicy(config.num_speculative_tokens, config.speculative_backoff_steps) \
        if config.speculative_adaptive else None
    return Speculator(proposer, blocks, sampler, policy)
