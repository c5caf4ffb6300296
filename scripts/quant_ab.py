"""Weight formats side by side: fp32, q8_0 and q4_1, the kernels alone and the whole engine decoding.

1. Kernels: one decode step's matrix products (the 30 layers' q|k|v, o, gate|up, down, then the LM
   head) for 1 and 8 rows, each format as the engine stores it (fp32: `Linear`, prepacked for oneDNN;
   q8_0 / q4_1: `QuantizedLinear`'s Numba kernel), with the bytes each step reads and the bandwidth
   that makes (bytes / time). Beside the wall time, the CPU time of the process (all its threads):
   on a machine shared with other work, a descheduled thread adds wall time but no CPU time.
2. Engine: decode tokens/s of `LLM.generate` at batch 1 and batch 8 (ignore_eos, greedy), one
   engine per format, rounds interleaved (A B C A B C ...) so the machine's noise hits all alike;
   a step's rate is its decode tokens over its time, summed over the decode-only steps of a round.
   Beside it the bound a step cannot beat: decode_weight_bytes() / the machine's copy bandwidth.

Medians over rounds are printed. Run at the thread count to compare, e.g.

    OMP_NUM_THREADS=2 MKL_NUM_THREADS=2 NUMBA_NUM_THREADS=2 python scripts/quant_ab.py [--rounds 5]

On a machine busy with other work, torch's OpenMP pool and Numba's spin while idle and take the cores
from each other; OMP_WAIT_POLICY=PASSIVE (set before the run) stops that, at a cost on a quiet machine
(measured here, 2 threads: a fp32 decode step 42 -> 68 ms, a q4_1 one 17 -> 42 ms).
"""

import argparse
import statistics
import time

import torch

from minibatch import LLM, EngineConfig, SamplingParams
from minibatch.engine.models import load_model
from minibatch.engine.models.gguf_blocks import gguf_file, read_blocks
from minibatch.engine.models.linear import Linear
from minibatch.engine.models.quantized import QuantizedLinear, QuantizedWeight, quantize_q8_0

FORMATS = (None, "q8_0", "q4_1")
FUSED = {"qkv": ["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"], "o": ["self_attn.o_proj"],
         "gate_up": ["mlp.gate_proj", "mlp.up_proj"], "down": ["mlp.down_proj"]}


def step_products(fmt, state_dict, blocks, num_layers):
    """Every product of a decode step in one format: a list of layers (dicts of products) and the LM head."""
    def make(names):
        if fmt is None:
            return Linear(torch.cat([state_dict[n] for n in names]))
        if fmt == "q8_0":
            return QuantizedLinear(quantize_q8_0(torch.cat([state_dict[n] for n in names])))
        return QuantizedLinear(QuantizedWeight.cat([blocks[n] for n in names]))
    layers = [{key: make([f"model.layers.{i}.{n}.weight" for n in names]) for key, names in FUSED.items()}
              for i in range(num_layers)]
    return layers, make(["lm_head.weight"])


def copy_bandwidth() -> float:
    """Bytes/s of copying a 256 MB buffer, the best of five: the memory bound a step is held to."""
    src = torch.ones(64 << 20)
    dst = torch.empty_like(src)
    best = min(_seconds(lambda: dst.copy_(src)) for _ in range(5))
    return 2 * src.numel() * 4 / best                                    # read + write


def _seconds(fn, clock=time.perf_counter) -> float:
    start = clock()
    fn()
    return clock() - start


def time_kernels(args, bandwidth):
    loaded = load_model(args.model)
    sd, layers = loaded.state_dict, loaded.config.num_hidden_layers
    blocks = read_blocks(gguf_file(args.model))
    products = {fmt: step_products(fmt, sd, blocks, layers) for fmt in FORMATS}
    hidden, inner = sd["model.layers.0.mlp.down_proj.weight"].shape     # (C, I)
    print(f"\nKernels alone: one step's products, median ms of {args.rounds} interleaved rounds")
    print(f"{'format':>7} {'rows':>4} {'layers':>9} {'head':>8} {'cpu ms':>7} {'MB read':>8} {'GB/s':>6} "
          f"{'bound ms':>9}")
    with torch.inference_mode():
        for rows in args.rows:
            x_in, x_mid = torch.randn(rows, hidden), torch.randn(rows, inner)   # (T, C), (T, I)

            def run_layers(fmt):
                for layer in products[fmt][0]:
                    layer["qkv"](x_in), layer["o"](x_in), layer["gate_up"](x_in), layer["down"](x_mid)
            times = {(fmt, part): [] for fmt in FORMATS for part in ("layers", "head", "cpu")}
            for fmt in FORMATS:                                              # warm up (compiles the kernels)
                run_layers(fmt), products[fmt][1](x_in)
            for _ in range(args.rounds):
                for fmt in FORMATS:
                    times[fmt, "layers"].append(_seconds(lambda: run_layers(fmt)))
                    times[fmt, "head"].append(_seconds(lambda: products[fmt][1](x_in)))
                    times[fmt, "cpu"].append(_seconds(lambda: (run_layers(fmt), products[fmt][1](x_in)),
                                                      time.process_time))
            for fmt in FORMATS:
                layer_s, head_s, cpu_s = (statistics.median(times[fmt, p]) for p in ("layers", "head", "cpu"))
                moved = sum(p.nbytes() for layer in products[fmt][0] for p in layer.values())
                moved += products[fmt][1].nbytes()
                print(f"{str(fmt):>7} {rows:>4} {layer_s * 1e3:>6.1f} ms {head_s * 1e3:>5.1f} ms {cpu_s * 1e3:>7.1f} "
                      f"{moved / 1e6:>8.1f} "
                      f"{moved / (layer_s + head_s) / 1e9:>6.1f} {moved / bandwidth * 1e3:>9.1f}")


def decode_rate(llm, prompts, new_tokens) -> float:
    """Decode tokens/s of one generate(): decode tokens over the time of the steps that only decoded."""
    first = len(llm.engine.step_records)
    llm.generate(prompts, SamplingParams(max_new_tokens=new_tokens, ignore_eos=True), use_tqdm=False)
    steps = [s for s in llm.engine.step_records[first:] if s.num_prefill_tokens == 0 and s.num_decode_tokens]
    return sum(s.num_decode_tokens for s in steps) / sum(s.duration for s in steps)


def time_engine(args, bandwidth):
    engines = {fmt: LLM(EngineConfig(model=args.model, quantization=fmt, max_batch_size=8, num_kv_blocks=64))
               for fmt in FORMATS}
    prompt = "Explain in a few sentences why the sky is blue."
    rates = {(fmt, batch): [] for fmt in FORMATS for batch in (1, 8)}
    for fmt in FORMATS:                                                      # warm up
        decode_rate(engines[fmt], [prompt], 4)
    for _ in range(args.rounds):
        for batch in (1, 8):
            for fmt in FORMATS:
                rates[fmt, batch].append(decode_rate(engines[fmt], [prompt] * batch, args.new_tokens))
    print(f"\nEngine: decode tokens/s, median of {args.rounds} interleaved rounds, {args.new_tokens} new tokens")
    print(f"{'format':>7} {'batch 1':>8} {'batch 8':>8} {'MB/token':>9} {'bound tok/s (batch 1)':>22}")
    for fmt in FORMATS:
        weight_bytes = engines[fmt].engine.model.decode_weight_bytes()
        print(f"{str(fmt):>7} {statistics.median(rates[fmt, 1]):>8.1f} {statistics.median(rates[fmt, 8]):>8.1f} "
              f"{weight_bytes / 1e6:>9.1f} {bandwidth / weight_bytes:>22.0f}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds; medians are printed")
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--skip", choices=["kernels", "engine"], help="leave one part out")
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 8],
                        help="rows of x for the kernels alone (1: a decode step of one user; 32: a prefill chunk)")
    args = parser.parse_args()
    bandwidth = copy_bandwidth()
    print(f"{args.model}: {torch.get_num_threads()} threads; copy bandwidth {bandwidth / 1e9:.1f} GB/s")
    if args.skip != "kernels":
        time_kernels(args, bandwidth)
    if args.skip != "engine":
        time_engine(args, bandwidth)


if __name__ == "__main__":
    main()
