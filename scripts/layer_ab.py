"""Decode steps with each layer as one compiled call (`kernels/layer_cpu.py`) against the same layers part by part.

One engine, its `model.whole_layers` switched on and off between rounds (A B A B ...), so both run on
the same weights and the machine's noise hits both alike; each round generates `--new-tokens` greedy
tokens for a batch of prompts, and the decode-only steps of the round give its step times. Prints the
median decode-step time of each way per batch size, their ratio, and whether the tokens were the same.

    OMP_NUM_THREADS=2 NUMBA_NUM_THREADS=2 python scripts/layer_ab.py [--quantization q4_1 | --dtype bfloat16]
        [--batch-sizes 1 4 8] [--parts-onednn]

With --parts-onednn the layers part by part multiply through each product's many-row path (oneDNN)
rather than the streamed loop, and the compiled layers stream every batch size: where the engine
switches from one to the other (`models.linear.streamed_rows`).
"""
import argparse
import statistics

from minibatch import LLM, EngineConfig, SamplingParams
from minibatch.engine.kernels.gemv_cpu import STREAM_ROWS


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--quantization", default=None, choices=[None, "q8_0", "q4_1"])
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 4, 8])
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds; medians are printed")
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--parts-onednn", action="store_true",
                        help="part by part through oneDNN, compiled layers streamed at every batch size")
    args = parser.parse_args()
    if args.parts_onednn and args.quantization:
        parser.error(f"--parts-onednn is for float32 or bfloat16 weights: --quantization {args.quantization} has no "
                     "oneDNN product")
    llm = LLM(EngineConfig(model=args.model, dtype=args.dtype, quantization=args.quantization,
                           max_batch_size=max(args.batch_sizes)))
    model = llm.engine.model

    def use(whole: bool):
        """Compiled layers, or the layers part by part (through oneDNN with --parts-onednn)."""
        model.whole_layers = whole
        if args.parts_onednn:
            for product in model.linears():
                product.stream_rows = STREAM_ROWS if whole else 0
            model._compiled_operands.clear()                        # asked again at the new limits
    params = SamplingParams(max_new_tokens=args.new_tokens, ignore_eos=True)
    print(f"{args.model}, {args.dtype}, weights {args.quantization or args.dtype}: median decode step over "
          f"{args.rounds} rounds")
    print(f"{'batch':>5} {'whole layers':>13} {'part by part':>13} {'ratio':>6}  same tokens")
    for batch in args.batch_sizes:
        prompts = [f"Write a short note about the number {i}." for i in range(batch)]
        steps, tokens = {True: [], False: []}, {True: [], False: []}
        for whole in (True, False):                                   # warm-up: compile both ways
            use(whole)
            llm.generate(prompts, SamplingParams(max_new_tokens=4, ignore_eos=True), use_tqdm=False)
        for _ in range(args.rounds):
            for whole in (True, False):
                use(whole)
                first = len(llm.engine.step_records)
                outs = llm.generate(prompts, params, use_tqdm=False)
                steps[whole] += [s.duration for s in llm.engine.step_records[first:] if s.num_prefill_tokens == 0]
                tokens[whole].append([o.token_ids for o in outs])
        whole_ms, parts_ms = (statistics.median(steps[w]) * 1e3 for w in (True, False))
        same = all(t == tokens[True][0] for t in tokens[True] + tokens[False])
        print(f"{batch:5d} {whole_ms:10.1f} ms {parts_ms:10.1f} ms {whole_ms / parts_ms:6.2f}  {same}")
    use(True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
