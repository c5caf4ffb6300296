"""Speculative decoding: proposers, verification rules, KV rollback, and end-to-end equality.

Greedy: every proposer's output equals transformers' generate() (and the plain engine) token for
token, in edge mode and under continuous batching. Sampling: the rejection rule keeps the target's
distribution, checked with chi-square tests at a fixed seed.
"""
from collections import Counter
from itertools import product

import pytest
import torch

from minibatch import LLM, ConfigError, EngineConfig, SamplingParams
from minibatch.engine.kv import BlockManager, blocks_for
from minibatch.analysis.metrics import speculation_summary
from minibatch.engine.models.tiny import random_llama, tiny_config
from minibatch.engine.sampling import filter_logits
from minibatch.engine.speculative import expected_tokens_per_step, ngram_propose, verify_greedy, verify_sampled
from tests.conftest import reference_greedy

PROMPTS = [[5, 6, 7, 8, 9, 5, 6, 7, 8, 9, 5, 6], list(range(20, 57)), [42], [3] * 17,
           list(range(60, 75)) * 2, [100, 101, 102, 100, 101]]
NEW = 24


def chi_square_p_value(observed: Counter, expected: dict, total: int) -> float:
    """p-value of a chi-square goodness-of-fit test; outcomes expected fewer than 5 times are pooled."""
    pooled_obs = pooled_exp = 0.0
    stat, bins = 0.0, 0
    for outcome, prob in expected.items():
        e, o = prob * total, observed.get(outcome, 0)
        if e < 5:
            pooled_obs, pooled_exp = pooled_obs + o, pooled_exp + e
            continue
        stat, bins = stat + (o - e) ** 2 / e, bins + 1
    if pooled_exp > 0:
        stat, bins = stat + (pooled_obs - pooled_exp) ** 2 / pooled_exp, bins + 1
    assert sum(observed.values()) == total and set(observed) <= set(expected), "an impossible outcome was drawn"
    dof = bins - 1
    return float(torch.special.gammaincc(torch.tensor(dof / 2), torch.tensor(stat / 2)))


# --- the pure pieces -------------------------------------------------------------------------------

def test_ngram_propose_copies_what_followed_the_latest_match():
    assert ngram_propose([1, 2, 3, 4, 9, 1, 2], k=3, n_max=3, n_min=1) == [3, 4, 9]
    assert ngram_propose([1, 2, 7, 8, 1, 2, 5, 6, 1, 2], k=2, n_max=2, n_min=1) == [5, 6]  # latest of two
    assert ngram_propose([4, 1, 2, 3, 5, 2, 3], k=2, n_max=3, n_min=2) == [5, 2]       # 3-gram absent, 2-gram found
    assert ngram_propose([4, 1, 2, 3, 5, 2, 3], k=2, n_max=3, n_min=3) == []           # too short a match
    assert ngram_propose([7, 8, 9, 7], k=5, n_max=2, n_min=1) == [8, 9, 7]             # fewer than k follow
    assert ngram_propose([1, 2, 3], k=2, n_max=2, n_min=1) == []
    assert ngram_propose([5], k=2, n_max=2, n_min=1) == []


def test_verify_greedy_accepts_the_matching_prefix_plus_one():
    assert verify_greedy([4, 5, 6], [4, 5, 6, 7]) == [4, 5, 6, 7]     # all accepted, plus the bonus token
    assert verify_greedy([4, 5, 6], [4, 9, 6, 7]) == [4, 9]           # stops at the first disagreement
    assert verify_greedy([4, 5, 6], [8, 5, 6, 7]) == [8]
    assert verify_greedy([], [3]) == [3]


def test_expected_tokens_per_step():
    assert expected_tokens_per_step(0.0, 4) == 1.0
    assert expected_tokens_per_step(1.0, 4) == 5.0
    assert expected_tokens_per_step(0.5, 2) == pytest.approx(1.75)


@pytest.mark.parametrize("drafts", ["sampled from q", "fixed guesses"])
def test_rejection_sampling_keeps_the_target_distribution(drafts):
    """A Markov chain over 4 tokens as the target, another as the draft: 3-token sequences produced by
    speculative steps (k=2) must follow the target chain, not the draft's."""
    V, L, k, trials = 4, 3, 2, 6000
    gen = torch.Generator().manual_seed(0)
    target = torch.softmax(2 * torch.randn(V + 1, V, generator=gen), -1)  # row t: p(next | t); row V: the start
    draft = torch.softmax(2 * torch.randn(V + 1, V, generator=gen), -1)
    counts = Counter()
    for _ in range(trials):
        seq = []
        while len(seq) < L:
            prev, guesses, qs = (seq[-1] if seq else V), [], []
            for _ in range(k):
                q = draft[guesses[-1] if guesses else prev]
                guesses.append(int(torch.multinomial(q, 1, generator=gen)) if drafts == "sampled from q" else int(q.argmax()))
                qs.append(q)
            p = torch.stack([target[prev]] + [target[g] for g in guesses])  # (k + 1, V)
            seq += verify_sampled(guesses, p, torch.stack(qs) if drafts == "sampled from q" else None, gen)
        counts[tuple(seq[:L])] += 1
    exact = {}
    for s in product(range(V), repeat=L):
        prob, prev = 1.0, V
        for t in s:
            prob, prev = prob * float(target[prev, t]), t
        exact[s] = prob
    assert chi_square_p_value(counts, exact, trials) > 1e-3


def test_block_manager_shrink_releases_blocks_past_a_length():
    bm = BlockManager(num_blocks=8, block_size=4)
    bm.allocate(0, 10)                                  # 3 blocks
    bm.allocate(1, 4)                                   # 1 block
    released = bm.block_tables[0][2:]
    bm.shrink(0, 5)                                     # 5 tokens fit in 2 blocks
    assert len(bm.block_tables[0]) == 2 and bm.tokens_stored[0] == 5
    assert bm.num_free_blocks == 8 - 3 and all(b in bm.free_blocks for b in released)
    bm.shrink(0, 8)                                     # nothing past 8 tokens is held: no change
    assert len(bm.block_tables[0]) == 2
    bm.shrink(7, 3)                                     # an unknown request: nothing to do
    bm.allocate(0, 12)
    assert len(bm.block_tables[0]) == 3 and len(set(bm.block_tables[0]) | set(bm.block_tables[1])) == 4
    contiguous = BlockManager(num_blocks=8, block_size=4, layout="contiguous", max_model_len=16)
    contiguous.allocate(0, 3)
    contiguous.shrink(0, 1)
    assert len(contiguous.block_tables[0]) == 4, "a contiguous reservation is kept whole"


# --- end to end on `tiny` ---------------------------------------------------------------------------

@pytest.fixture(scope="module")
def references(tiny_hf):
    return [reference_greedy(tiny_hf[0], p, NEW) for p in PROMPTS]


def perturbed_tiny(folder, noise: float) -> str:
    """`tiny` with noise added to its weights, saved to folder: a draft that agrees with it often, not always."""
    model = random_llama(tiny_config())
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if not name.endswith("norm.weight"):
                param.add_(noise * torch.randn(param.shape, generator=gen))
    model.save_pretrained(folder)
    return str(folder)


@pytest.fixture(scope="module")
def noisy_draft(tmp_path_factory):
    return perturbed_tiny(tmp_path_factory.mktemp("noisy_draft"), noise=0.03)


def method_options(method: str, noisy_draft: str) -> dict:
    """Every decoding sequence drafts k (speculative_adaptive=False): these tests check the verify mechanics;
    tests/test_draft_policy.py checks the policy that drafts only what pays."""
    return {"speculative_adaptive": False, **{
        "ngram": {"speculative_method": "ngram"},
        "layer_skip": {"speculative_method": "layer_skip", "speculative_layers": 2},
        "draft (itself)": {"speculative_method": "draft", "speculative_model": "tiny"},
        "draft (noisy)": {"speculative_method": "draft", "speculative_model": noisy_draft}}[method]}


@pytest.mark.parametrize("method", ["ngram", "layer_skip", "draft (itself)", "draft (noisy)"])
@pytest.mark.parametrize("scheduler,max_batch_size,block_size", [("continuous", 4, 4), ("edge", 1, 16)])
def test_greedy_output_equals_generate(references, noisy_draft, method, scheduler, max_batch_size, block_size):
    llm = LLM(EngineConfig(model="tiny", scheduler=scheduler, max_batch_size=max_batch_size, block_size=block_size,
                           num_speculative_tokens=3, **method_options(method, noisy_draft)))
    outs = llm.generate(PROMPTS, SamplingParams(max_new_tokens=NEW), use_tqdm=False)
    assert [o.token_ids for o in outs] == references
    assert llm.engine.blocks.num_free_blocks == llm.engine.blocks.num_blocks
    outcomes = [st.spec_outcomes for st in llm.engine.step_records]
    assert any(outcomes), "nothing was drafted"
    assert all(0 <= a <= d <= 3 for step in outcomes for d, a in step)
    if scheduler == "continuous":
        assert max(len(step) for step in outcomes) >= 2, "no two sequences speculated in the same step"


def test_plain_engine_agrees(references):
    outs = LLM(EngineConfig(model="tiny", max_batch_size=4)).generate(PROMPTS, SamplingParams(max_new_tokens=NEW),
                                                                        use_tqdm=False)
    assert [o.token_ids for o in outs] == references


def test_rejected_drafts_are_rolled_back(references, noisy_draft):
    """After every step a sequence holds exactly the blocks of its cached tokens, and the draft never
    believes it has cached more than the target."""
    llm = LLM(EngineConfig(model="tiny", max_batch_size=4, block_size=2, num_speculative_tokens=4,
                           **method_options("draft (noisy)", noisy_draft)))
    engine, released = llm.engine, 0
    requests = [engine.add_request(p, SamplingParams(max_new_tokens=NEW)) for p in PROMPTS]
    while engine.has_unfinished():
        engine.step()
        for r in engine.scheduler.running:
            assert len(engine.blocks.block_tables[r.request_id]) == blocks_for(r.num_computed_tokens, 2)
            assert engine.blocks.tokens_stored[r.request_id] == r.num_computed_tokens
            assert engine.decoder.proposer.computed.get(r.request_id, 0) <= r.num_computed_tokens
        released += sum(d - a for d, a in engine.step_records[-1].spec_outcomes)
    assert released > 0, "the noisy draft was meant to be rejected sometimes"
    assert [r.output_token_ids for r in requests] == references
    summary = speculation_summary(engine.step_records)
    assert 0 < summary["spec_acceptance_rate"] < 1 and 1 < summary["spec_tokens_per_step"] < 5


@pytest.mark.parametrize("max_tokens_per_step", [512, 7])
def test_preemption_and_chunked_prefill_while_speculating_keep_tokens(references, noisy_draft, max_tokens_per_step):
    llm = LLM(EngineConfig(model="tiny", max_batch_size=6, block_size=4, num_kv_blocks=24, num_speculative_tokens=3,
                           max_tokens_per_step=max_tokens_per_step, **method_options("draft (noisy)", noisy_draft)))
    outs = llm.generate(PROMPTS, SamplingParams(max_new_tokens=NEW), use_tqdm=False)
    if max_tokens_per_step == 512:
        assert sum(o.metrics.num_preemptions for o in outs) > 0, "the KV pool was meant to force preemption"
    else:
        assert any(st.num_prefill_tokens and st.spec_outcomes for st in llm.engine.step_records), "no mixed step"
    assert [o.token_ids for o in outs] == references
    assert llm.engine.blocks.num_free_blocks == 24


def test_sampled_speculation_follows_the_model(tiny_hf, tmp_path):
    """Temperature 1, top-k 2: the 4-token continuations of speculative sampling follow the target's
    exact distribution (computed with transformers), though a perturbed draft proposes them."""
    prompt, new, n = [10, 20, 30, 40], 4, 600
    params = [SamplingParams(max_new_tokens=new, temperature=1.0, top_k=2, seed=i, ignore_eos=True) for i in range(n)]
    llm = LLM(EngineConfig(model="tiny", max_batch_size=64, num_speculative_tokens=3, speculative_method="draft",
                           speculative_model=perturbed_tiny(tmp_path, noise=0.01), speculative_adaptive=False))
    counts = Counter(tuple(o.token_ids) for o in llm.generate([prompt] * n, params, use_tqdm=False))
    outcomes = [o for st in llm.engine.step_records for o in st.spec_outcomes]
    assert any(a < d for d, a in outcomes) and any(a > 0 for _, a in outcomes), "want both accepted and rejected drafts"
    exact, model = {(): 1.0}, tiny_hf[0]
    with torch.no_grad():
        for _ in range(new):
            grown = {}
            for seq, prob in exact.items():
                logits = model(torch.tensor([prompt + list(seq)])).logits[0, -1]
                p = filter_logits(logits, params[0]).softmax(-1)
                for t in p.nonzero().flatten().tolist():
                    grown[seq + (t,)] = prob * float(p[t])
            exact = grown
    assert chi_square_p_value(counts, exact, n) > 1e-3


def test_bad_speculative_settings_fail_clearly(tmp_path):
    with pytest.raises(ConfigError, match="speculative_layers=4"):
        LLM(EngineConfig(model="tiny", speculative_method="layer_skip", speculative_layers=4))
    config = tiny_config()
    config.vocab_size = 97
    random_llama(config).save_pretrained(tmp_path)
    with pytest.raises(ConfigError, match="same tokenizer"):
        LLM(EngineConfig(model="tiny", speculative_method="draft", speculative_model=str(tmp_path)))
    with pytest.raises(ConfigError, match="scheduler"):
        EngineConfig(model="tiny", scheduler="static", speculative_method="ngram")


def test_compare_speculation_rows_on_the_same_tokens(noisy_draft):
    """One row per engine, plain first; the speculative row reports acceptance and a step cost from
    its own steps, and an engine that changes the tokens is refused."""
    from minibatch.bench.speculative import compare_speculation

    base = dict(model="tiny", scheduler="edge", num_speculative_tokens=3, speculative_adaptive=False)
    engines = {"plain": LLM(EngineConfig(model="tiny", scheduler="edge")),
               "ngram": LLM(EngineConfig(**base, speculative_method="ngram"))}
    rows = compare_speculation(engines, PROMPTS[:2], max_new_tokens=NEW)
    plain, ngram = rows
    assert [r["engine"] for r in rows] == ["plain", "ngram"]
    assert plain["speedup"] == plain["step_cost"] == plain["predicted_speedup"] == 1.0
    assert plain["acceptance_rate"] is None and plain["tokens_per_step"] == 1.0 and plain["drafting_steps"] == 0
    assert plain["tokens"] == ngram["tokens"] == 2 * NEW
    assert 0 < ngram["acceptance_rate"] <= 1 and ngram["tokens_per_step"] > 1 and ngram["step_cost"] > 0
    assert 0 < ngram["drafting_steps"] <= 1 and ngram["formula_tokens_per_step"] >= 1 and ngram["predicted_speedup"] > 0
    another_model = {"plain": engines["plain"], "other": LLM(EngineConfig(model=noisy_draft, scheduler="edge"))}
    with pytest.raises(AssertionError, match="other tokens"):
        compare_speculation(another_model, PROMPTS[:2], max_new_tokens=NEW)


def test_speedup_by_batch_reports_what_makes_the_speedup():
    import matplotlib
    matplotlib.use("Agg")
    from minibatch.bench.speculative import speedup_by_batch
    from minibatch.viz import speedup_vs_batch

    plain = LLM(EngineConfig(model="tiny", max_batch_size=4))
    ngram = LLM(EngineConfig(model="tiny", max_batch_size=4, speculative_method="ngram", num_speculative_tokens=3,
                             speculative_adaptive=False))
    rows = speedup_by_batch(plain, ngram, PROMPTS[0], batch_sizes=(1, 4), max_new_tokens=NEW)
    assert [r["batch_size"] for r in rows] == [1, 4]
    for r in rows:
        assert r["tokens_per_step"] > 1 and r["step_cost"] > 0 and r["speedup"] > 0
        assert r["speedup"] == pytest.approx(r["speculative_tok_s"] / r["plain_tok_s"])
    assert len(speedup_vs_batch(rows).axes[0].lines) == 4        # three series and the line at 1
