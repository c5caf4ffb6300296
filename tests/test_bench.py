"""The benchmark: outputs checked against the greedy reference before time counts, a wrong system
rejected, runs interleaved, the results' JSON shape, the roofline arithmetic. No timing is asserted."""
import json

import pytest
import torch

from minibatch.__main__ import main as cli
from minibatch.bench import measure, report, roofline
from minibatch.bench.suite import SYSTEM_NAMES, Scale, run_bench
from minibatch.bench.check import compare, reference_outputs
from minibatch.bench.peers.hf import HFContinuous, HFGenerate
from minibatch.bench.peers.systems import Minibatch, System
from minibatch.bench.workloads import BenchWorkload
from minibatch.bench.workloads import offline_workload

SMALL = Scale(num_requests=4, prompt_median=8, output_mean=4, output_cap=8, batch_sizes=(2, 4), reps=2,
              online_requests=3, online_reps=2, rate_fractions=(1.0,), decode_steps=2, decode_prompt=8,
              gemm_size=64)


def corrupt(outputs):
    """One token changed in the first request, the last request one token short: plausible-looking but wrong."""
    outputs[0] = [outputs[0][0] + 1] + outputs[0][1:]
    outputs[-1] = outputs[-1][:-1]
    return outputs


class WrongMinibatch(Minibatch):
    """minibatch continuous, with corrupted outputs: it must be rejected."""

    def __init__(self, name="wrong"):
        super().__init__("tiny", "continuous")
        self.name = self.label = name

    def offline(self, prompts, output_lens):
        result = super().offline(prompts, output_lens)
        result.outputs = corrupt(result.outputs)
        return result

    def online(self, prompts, output_lens, arrivals):
        result = super().online(prompts, output_lens, arrivals)
        result.outputs = corrupt(result.outputs)
        return result


@pytest.fixture(scope="module")
def results():
    return run_bench("tiny", SMALL, systems=[*SYSTEM_NAMES, WrongMinibatch()], physical=False, use_tqdm=False)


def test_real_systems_match_the_reference_and_the_wrong_one_is_rejected(results):
    systems = results["offline"]["systems"]
    for name in SYSTEM_NAMES:
        assert systems[name]["verified"], (name, systems[name]["match"])
        assert systems[name]["match"]["requests_equal"] == SMALL.num_requests * SMALL.reps * len(SMALL.batch_sizes)
    wrong = systems["wrong"]
    runs = SMALL.reps * len(SMALL.batch_sizes)
    assert not wrong["verified"]
    assert wrong["match"]["requests_equal"] == (SMALL.num_requests - 2) * runs
    assert wrong["match"]["first_mismatch"] == 0
    assert 0 < wrong["match"]["token_rate"] < 1
    online = results["online"]["systems"]
    assert not online["wrong"]["verified"]
    assert all(online[n]["verified"] for n in ("minibatch-continuous", "minibatch-static", "hf-continuous"))
    assert "hf-generate" not in online                          # padded batches are measured offline only


def test_every_system_generates_exactly_the_drawn_lengths(results):
    lens = results["workload"]["output_lens"]
    assert results["workload"]["output_tokens"] == sum(lens)
    assert len(lens) == SMALL.num_requests and max(lens) <= SMALL.output_cap


def test_runs_are_interleaved(results):
    names = results["settings"]["systems"]
    order = results["offline"]["order"]
    assert len(order) == len(SMALL.batch_sizes) * SMALL.reps * len(names)
    expected = [(bs, rep, n) for bs in SMALL.batch_sizes for rep in range(SMALL.reps) for n in names]  # A B C, A B C
    assert [(o["batch_size"], o["rep"], o["system"]) for o in order] == expected
    online = results["online"]
    serving = list(online["systems"])
    assert [(o["rate"], o["rep"], o["system"]) for o in online["order"]] == \
        [(r, rep, n) for r in online["rates"] for rep in range(SMALL.online_reps) for n in serving]


def test_results_schema(results, tmp_path):
    assert results["schema"] == report.SCHEMA
    loaded = json.loads(json.dumps(results))                    # plain JSON all the way down
    assert {"settings", "machine", "workload", "offline", "online", "roofline", "goals"} <= set(loaded)
    assert {"cpu", "cores", "usable_cores", "torch_threads", "load_average_1min"} <= set(loaded["machine"])
    for system in loaded["offline"]["systems"].values():
        assert system["best_batch_size"] in SMALL.batch_sizes
        for row in system["by_batch_size"]:
            tok_s = row["tok_s"]
            assert len(tok_s["samples"]) == SMALL.reps
            assert tok_s["min"] <= tok_s["median"] <= tok_s["max"]
        best = max(system["by_batch_size"], key=lambda r: r["tok_s"]["median"])
        assert best["batch_size"] == system["best_batch_size"]
    for system in loaded["online"]["systems"].values():
        assert [row["rate"] for row in system["by_rate"]] == loaded["online"]["rates"]
        assert all(len(row["p99_ttft_s"]["samples"]) == SMALL.online_reps for row in system["by_rate"])
    assert loaded["settings"]["batch_sizes"] == list(SMALL.batch_sizes)
    paths = report.write(results, tmp_path)
    assert json.loads(paths[0].read_text())["offline"] == loaded["offline"] and paths[1].stat().st_size > 0
    assert "UNVERIFIED" in report.text(results)


def test_ratios_and_goals_follow_the_medians(results):
    systems = results["offline"]["systems"]
    by_pair = {(r["a"], r["b"]): r for r in report.ratios(results["offline"], SMALL.num_requests)}
    r = by_pair[("minibatch-continuous", "minibatch-static")]
    # judged where a finished request's slot can be refilled: the only size below the 4 requests is 2
    assert r["batch_size_b"] == r["batch_size_a"] == 2
    cont = next(x for x in systems["minibatch-continuous"]["by_batch_size"] if x["batch_size"] == r["batch_size_a"])
    static = next(x for x in systems["minibatch-static"]["by_batch_size"] if x["batch_size"] == r["batch_size_a"])
    assert r["value"] == pytest.approx(cont["tok_s"]["median"] / static["tok_s"]["median"])
    goal = next(g for g in results["goals"] if "minibatch static" in g["goal"])
    assert goal["measured"] == pytest.approx(r["value"]) and goal["met"] == (r["value"] >= 2.0)
    assert all(g["met"] is None for g in results["goals"] if "bandwidth" in g["goal"] or "overhead" in g["goal"])


def test_goals_are_not_judged_against_a_rejected_peer():
    class WrongGenerate(HFGenerate):
        def offline(self, prompts, output_lens):
            result = super().offline(prompts, output_lens)
            result.outputs = corrupt(result.outputs)
            return result

    from minibatch.engine.models import load_hf
    hf, _ = load_hf("tiny")
    scale = Scale(**{**SMALL.__dict__, "batch_sizes": (2,), "reps": 1})
    out = run_bench("tiny", scale, systems=["minibatch-continuous", WrongGenerate(hf, 0)], online=False,
                    physical=False, use_tqdm=False)
    assert not out["offline"]["systems"]["hf-generate"]["verified"]
    (r,) = report.ratios(out["offline"])
    assert r["b"] == "hf-generate" and r["verified"] is False
    goal = next(g for g in out["goals"] if "padded generate" in g["goal"])
    assert goal["met"] is None and goal["measured"] == pytest.approx(r["value"])


def test_reference_and_peers_run_past_the_models_own_eos():
    from minibatch.engine.models import load_hf
    hf, _ = load_hf("tiny")
    prompt = [5, 6, 7, 8, 9]
    free = reference_outputs(hf, [prompt], [8], use_tqdm=False)[0]
    hf.generation_config.eos_token_id = [free[2]]              # the model now "ends" after its third token
    assert reference_outputs(hf, [prompt], [8], use_tqdm=False)[0] == free
    for peer in (HFGenerate(hf, 0), HFContinuous(hf)):
        peer.prepare(2, 16)
        assert peer.offline([prompt, [1, 2]], [8, 3]).outputs[0] == free, peer.name


def test_compare_counts_requests_and_agreeing_prefixes():
    ref = [[1, 2, 3], [4, 5], [6]]
    assert compare(ref, ref).exact and compare(ref, ref).token_rate == 1.0
    m = compare([[1, 9, 3], [4, 5]], ref)                       # a changed token, a missing request
    assert (m.requests_equal, m.tokens_agreeing, m.first_mismatch) == (1, 3, 0)
    m = compare([[1, 2, 3], [4, 5], [6, 7]], ref)               # one token too many is wrong too
    assert not m.exact and m.first_mismatch == 2


def test_offline_workload_shape(tiny_hf):
    model, tokenizer = tiny_hf
    w = offline_workload(SMALL, tokenizer, model.config.vocab_size, seed=3)
    again = offline_workload(SMALL, tokenizer, model.config.vocab_size, seed=3)
    assert w == again                                            # a seed fixes the workload
    assert all(1 <= n <= SMALL.output_cap for n in w.output_lens)
    assert w.max_len == max(len(p) + n for p, n in zip(w.prompts, w.output_lens))
    no_tokenizer = offline_workload(SMALL, None, model.config.vocab_size, seed=3)
    assert all(8 <= t < model.config.vocab_size for p in no_tokenizer.prompts for t in p)


def test_roofline_arithmetic(tiny_hf):
    model, _ = tiny_hf
    roof = roofline.measure("tiny", model.config, batch_sizes=(1, 8), steps=2, prompt_tokens=8, gemm_size=64, rounds=2)
    assert roof["weight_bytes"] == 4 * sum(p.numel() for p in model.parameters())   # fp32, tied LM head counted once
    c = model.config
    assert roof["kv_bytes_per_token"] == 4 * 2 * c.num_hidden_layers * c.num_key_value_heads * c.head_dim
    one, eight = roof["decode"]
    assert eight["compute_bound_s"] > 3 * one["compute_bound_s"]
    assert eight["memory_bound_s"] > one["memory_bound_s"]
    for d in (one, eight):
        assert d["bound_s"] == max(d["memory_bound_s"], d["compute_bound_s"])
        assert d["fraction_of_bound"] == pytest.approx(d["bound_s"] / d["step_s"])
        assert d["bytes_read"] > roof["weight_bytes"]                   # every weight and the batch's KV
        assert d["achieved_Bps"] == pytest.approx(d["bytes_read"] / d["step_s"])
    assert eight["bytes_read"] > one["bytes_read"]                     # the same weights, more KV
    assert one["steps_timed"] == eight["steps_timed"] == 2 * 2         # both rounds' decode steps, 2 a round
    assert roof["step_8_over_1"] == pytest.approx(eight["step_s"] / one["step_s"])
    text = "\n".join(report.roofline_lines(roof))
    assert "GB/s" in text and "a decode step of 8 costs" in text
    o = roof["overhead"]
    assert 0 < o["engine_share"] < 1 and set(o["phases_s"]) == {"schedule", "model", "sample", "update"}


def test_saturating_batch_is_the_knee_of_the_roofline():
    from minibatch.analysis.roofline import balance, saturating_batch
    from minibatch.sim.costmodel import ModelSize, RooflineCostModel
    from minibatch.engine.models.tiny import tiny_config
    size, context = ModelSize.of(tiny_config()), 64
    weights = 4 * (size.body_params + size.lm_head_params)
    memory_only = RooflineCostModel(float("inf"), 1e9, 0.0, 4, 1.0, size)
    # (weights + B * kv) / bandwidth per step: half the limit when the batch's KV bytes equal the weights
    assert abs(saturating_batch(memory_only, context) - weights / (4 * size.kv_values_per_token * context)) <= 1
    compute_only = RooflineCostModel(1e9, float("inf"), 0.01, 4, 1.0, size)
    per_seq = 2 * (size.body_params + size.lm_head_params) + 4 * size.attention_width * context
    # overhead + B * flops / peak: half the limit when the batch's arithmetic takes as long as the overhead
    assert abs(saturating_batch(compute_only, context) - 0.01 * 1e9 / per_seq) <= 1
    row = balance(compute_only, context)
    assert row["overhead_share_batch1"] == pytest.approx(0.01 / (0.01 + per_seq / 1e9))
    assert row["overhead_share_saturated"] == pytest.approx(0.5, abs=0.05)


def test_kv_against_weights_and_saturation_by_overhead():
    from minibatch.analysis.roofline import kv_against_weights, saturating_batch, saturation_by_overhead
    from minibatch.engine.kv import kv_bytes_per_token
    from minibatch.engine.models.tiny import tiny_config
    from minibatch.sim.costmodel import ModelSize, RooflineCostModel
    config = tiny_config()                                   # 4 layers, 2 KV heads of 32, fp32 here
    row = kv_against_weights(config, torch.float32)
    size = ModelSize.of(config)
    assert row["kv_bytes_per_token"] == kv_bytes_per_token(4, 2, 32, torch.float32) == 2 * 4 * 2 * 32 * 4
    assert row["weight_bytes"] == 4 * (size.body_params + size.lm_head_params)
    assert row["match_tokens"] == pytest.approx(row["weight_bytes"] / row["kv_bytes_per_token"])
    bf16 = kv_against_weights(config)                        # the default: halves both, the ratio stays
    assert bf16["kv_per_weight_byte"] == pytest.approx(row["kv_per_weight_byte"])
    memory_only = RooflineCostModel(float("inf"), 1e9, 0.0, 4, 1.0, size)
    by = saturation_by_overhead({"m": memory_only}, 64, overheads_s=(0.0, 1e-3))
    assert by[0.0]["m"] == saturating_batch(memory_only, 64)
    assert by[1e-3]["m"] > by[0.0]["m"]                      # an overhead per step is shared out by more sequences


def test_bad_flags_are_refused_before_any_work(capsys):
    assert cli(["bench", "--model", "tiny", "--rates", "0"]) == 2
    assert "--rates" in capsys.readouterr().err
    assert cli(["bench", "--model", "no-such-model"]) == 2
    assert "no-such-model" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli(["bench", "--systems", "vllm"])


def test_continuous_is_set_against_static_where_slots_can_be_refilled():
    def system(tok_s_by_size):
        rows = [{"batch_size": b, "tok_s": {"median": v, "min": v, "max": v}} for b, v in tok_s_by_size.items()]
        return {"verified": True, "best_batch_size": max(tok_s_by_size, key=tok_s_by_size.get), "by_batch_size": rows}
    offline = {"systems": {"minibatch-continuous": system({16: 30.0, 32: 35.0}),
                           "minibatch-static": system({16: 20.0, 32: 35.0})}}
    (below,) = report.ratios(offline, num_requests=32)
    assert (below["batch_size_a"], below["value"]) == (16, pytest.approx(1.5))
    (unlimited,) = report.ratios(offline, num_requests=64)          # every size below: the best one
    assert (unlimited["batch_size_a"], unlimited["value"]) == (32, pytest.approx(1.0))
    (none_below,) = report.ratios(offline, num_requests=8)          # none below: fall back to the best
    assert none_below["batch_size_a"] == 32


@pytest.mark.parametrize("native", [True, False])
def test_bfloat16_against_vllm_is_judged_at_each_batch_size_only_on_a_cpu_with_native_bf16(monkeypatch, native):
    measured = [{"a": "minibatch-bf16", "b": "vllm-bf16", "batch_size": bs, "value": value, "verified": True}
                for bs, value in ((8, 0.9), (1, 1.6))]
    monkeypatch.setattr(report.shipped, "summarize", lambda results: {"ratios": measured})
    results = {"offline": {"systems": {}}, "settings": {}, "machine": {"native_bf16": native}, "roofline": None}
    found = [g for g in report.goals(results) if g["goal"].startswith("minibatch bfloat16")]
    assert [g["goal"].split(" at batch ")[1].split(" ")[0] for g in found] == ["1", "8"]
    assert [g["measured"] for g in found] == [1.6, 0.9]
    assert [g["met"] for g in found] == ([True, False] if native else [None, None])
    assert native or all("no native BF16" in g["note"] for g in found)


def test_a_run_waits_out_the_busy_loop_of_the_system_before_it(monkeypatch):
    """vLLM's worker polls its queue for a second after a run: the next run starts after it, whatever system."""
    slept = []
    monkeypatch.setattr(measure.time, "sleep", slept.append)
    quiet_one, busy_one = type("Quiet", (), {"busy_after_s": 0.0})(), type("Busy", (), {"busy_after_s": 1.5})()
    quiet = measure.Quiet()
    for system in (quiet_one, busy_one, quiet_one, quiet_one, busy_one, busy_one):
        quiet.before(system)
    assert slept == [1.5, 1.5]      # before the run after each busy run: the third and the sixth


class Stoppable:
    """A system as the measuring loop sees it: whether pause() can stop it, and its busy loop after a run."""

    def __init__(self, name, stoppable, busy_after_s, calls):
        self.name, self.stoppable, self.busy_after_s, self.calls = name, stoppable, busy_after_s, calls

    def pause(self):
        self.calls.append(("pause", self.name))
        return self.stoppable

    def resume(self):
        self.calls.append(("resume", self.name))


def test_while_one_system_runs_the_others_are_stopped_and_a_stopped_busy_loop_is_not_waited_for(monkeypatch):
    slept, calls = [], []
    monkeypatch.setattr(measure.time, "sleep", slept.append)
    here, peer, child = (Stoppable("here", False, 0.0, calls), Stoppable("peer", True, 1.5, calls),
                         Stoppable("child", False, 1.5, calls))
    quiet = measure.Quiet([here, peer, child])
    quiet.before(peer)
    assert calls == [("pause", "here"), ("resume", "peer"), ("pause", "child")] and slept == []
    quiet.before(here)              # the peer ran last but is stopped now: its busy loop is frozen, no wait
    assert ("pause", "peer") in calls[3:] and slept == []
    quiet.before(child)
    quiet.before(here)              # the child could not be stopped: its busy loop is waited out
    assert slept == [1.5]
    del calls[:]
    quiet.done()
    assert calls == [("resume", "here"), ("resume", "peer"), ("resume", "child")]



class Breaking(System):
    """A system whose run fails with an error the measuring loop does not catch, beside a peer it stopped."""

    name = label = "breaking"

    def prepare(self, batch_size, max_len):
        pass

    def offline(self, prompts, output_lens):
        raise RuntimeError("a bug in the middle of a run")


class StoppablePeer(System):
    name = label = "stoppable"

    def __init__(self):
        self.stopped = False

    def prepare(self, batch_size, max_len):
        pass

    def pause(self):
        self.stopped = True
        return True

    def resume(self):
        self.stopped = False


def test_a_run_that_fails_leaves_no_peer_stopped():
    peer = StoppablePeer()
    with pytest.raises(RuntimeError, match="a bug in the middle"):
        measure.run_offline([Breaking(), peer], BenchWorkload([[1, 2]], [2]), {}, (1,), 1, use_tqdm=False)
    assert not peer.stopped
