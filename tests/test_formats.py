"""Weight formats side by side (minibatch.bench.formats): one row per format with its bytes, its bound and
its tokens, measured in interleaved rounds; where tokens part is found; the chart draws each row; the peers'
shipped figures are printed when shipped and said to be missing otherwise."""
import matplotlib
import pytest

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from minibatch import LLM, EngineConfig  # noqa: E402
from minibatch.bench import formats  # noqa: E402
from minibatch.bench.formats import (BANDWIDTH, compare_formats, first_difference, shipped_peer_lines,  # noqa: E402
                                     step_name, table_lines, top2_gap)
from minibatch.viz import formats_vs_bounds  # noqa: E402

NEW = 6


@pytest.fixture(scope="module")
def compared():
    config = dict(model="tiny", scheduler="edge", block_size=8, num_kv_blocks=16)
    llms = {"fp32": LLM(EngineConfig(**config)), "q8_0": LLM(EngineConfig(**config, quantization="q8_0"))}
    return llms, *compare_formats(llms, [5, 6, 7, 8, 9], max_new_tokens=NEW, rounds=3)


def test_a_row_per_format_with_its_bytes_bound_and_tokens(compared):
    llms, rounds, rows = compared
    assert [r["format"] for r in rows] == ["fp32", "q8_0"]
    assert rounds.num_rounds == 3 and set(rounds.values) == {step_name("fp32"), step_name("q8_0"), BANDWIDTH}
    for r in rows:
        model = llms[r["format"]].engine.model
        assert r["weight_bytes"] == model.decode_weight_bytes() and len(r["tokens"]) == NEW
        assert r["bound_tok_s"] == pytest.approx(1e9 * rounds.most(BANDWIDTH) / r["weight_bytes"])
        assert r["tok_s"] == pytest.approx(1 / rounds.best(step_name(r["format"])))
        assert r["of_bound"] == pytest.approx(r["tok_s"] / r["bound_tok_s"])
    fp32, q8_0 = rows
    assert 4 <= fp32["bytes_per_weight"] < 4.1 and 34 / 32 <= q8_0["bytes_per_weight"] < fp32["bytes_per_weight"] / 3
    assert fp32["parts_at"] is None and fp32["gap_at_part"] is None
    if q8_0["parts_at"] is not None:
        assert q8_0["tokens"][:q8_0["parts_at"]] == fp32["tokens"][:q8_0["parts_at"]] and q8_0["gap_at_part"] >= 0
    lines = table_lines(rows, NEW)
    assert len(lines) == 3 and lines[1].startswith("fp32") and "the reference" in lines[1]


def test_where_tokens_part_and_the_gap_there():
    assert first_difference([1, 2, 3], [1, 2, 3]) is None
    assert first_difference([1, 2, 4, 5], [1, 2, 3, 5]) == 2
    assert top2_gap({7: -0.5, 3: -0.5, 9: -2.0}) == 0.0
    assert top2_gap({7: -0.25, 9: -1.5}) == pytest.approx(1.25)


def test_the_chart_draws_each_format_inside_its_bound(compared):
    _, _, rows = compared
    ax = formats_vs_bounds(rows).axes[0]
    heights = [round(p.get_height(), 6) for p in ax.patches]
    assert heights == [round(r[k], 6) for k in ("bound_tok_s", "tok_s") for r in rows]
    assert [t.get_text() for t in ax.get_xticklabels()][0].startswith("fp32")
    plt.close("all")


def test_peers_are_printed_from_shipped_results_or_said_missing(monkeypatch):
    summary = {"machine": {"cpu": "AMD EPYC", "threads": 2}, "date": "2026-12-01T12:00:00+00:00",
               "systems": {"minibatch-continuous": {"label": "minibatch, fp32",
                                                    "tok_s": {"1": {"median": 33.0, "min": 30, "max": 35}}},
                           "llamacpp-q4_1": {"label": "llama.cpp, Q4_1 GGUF, batch 1",
                                             "tok_s": {"1": {"median": 85.0, "min": 80, "max": 88}}},
                           "vllm": {"label": "vLLM-CPU", "tok_s": {"1": {"median": 20.0, "min": 19, "max": 21}}}}}
    monkeypatch.setattr(formats, "load_shipped", lambda: summary)
    lines = shipped_peer_lines("llamacpp")
    assert "AMD EPYC" in lines[0] and "2026-12-01" in lines[0] and len(lines) == 3
    assert "llama.cpp, Q4_1 GGUF" in lines[2] and "85.0" in lines[2] and not any("vLLM" in line for line in lines)

    def nothing_shipped():
        raise FileNotFoundError("no results shipped")
    monkeypatch.setattr(formats, "load_shipped", nothing_shipped)
    assert shipped_peer_lines("llamacpp")[0].startswith("no shipped results of llamacpp")
