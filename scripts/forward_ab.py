"""Time the engine's forward pass against an earlier commit's, side by side in one process.

The model (minibatch/engine/models/llama.py) and the torch attention (minibatch/engine/kernels/torch_ref.py)
of BEFORE are loaded from git next to the current ones, each version builds its own weights from
the same checkpoint (so a change in how weights are stored is timed too); the same engine then
runs decode steps with each in turn (A B A B ...), checks that both produce the same tokens, and prints the median
decode-step time per batch size and how many torch operators a batch-1 step calls.

    python scripts/forward_ab.py --before 63dadf5 [--reps 5] [--batch-sizes 1 8 32] [--dtype bfloat16]
"""
import argparse
import importlib.util
import statistics
import subprocess
import tempfile
from pathlib import Path

from torch.profiler import ProfilerActivity, profile

import minibatch.engine.kernels.torch_ref as current_attention
from minibatch import LLM, EngineConfig, SamplingParams
from minibatch.engine.models import load_model

FILES = {"model": "minibatch/engine/models/llama.py", "attention": "minibatch/engine/kernels/torch_ref.py"}


def module_at(commit: str, path: str, folder: Path):
    """The module `path` as it was at `commit`, loaded under a private name."""
    source = subprocess.run(["git", "show", f"{commit}:{path}"], capture_output=True, text=True, check=True).stdout
    file = folder / path.replace("/", "_")
    file.write_text(source)
    spec = importlib.util.spec_from_file_location(f"before_{file.stem}", file)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", required=True, help="the commit to compare against")
    parser.add_argument("--reps", type=int, default=5, help="interleaved repetitions per batch size")
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        model_before = module_at(args.before, FILES["model"], Path(folder))
        attention = module_at(args.before, FILES["attention"], Path(folder))
    llm = LLM(EngineConfig(model="smollm2-135m", max_batch_size=max(args.batch_sizes), dtype=args.dtype))
    engine, runner = llm.engine, llm.engine.runner
    loaded = load_model("smollm2-135m")
    before_model = model_before.LlamaModel(loaded, engine.dtype, engine.device, engine.max_model_len)
    versions = {"before": (before_model, attention), "after": (runner.model, current_attention)}

    def run(version, batch, tokens=16):
        runner.model, runner.backend = versions[version]
        first = len(llm.engine.step_records)
        outs = llm.generate(["Once upon a time"] * batch, SamplingParams(max_new_tokens=tokens, ignore_eos=True),
                            use_tqdm=False)
        steps = [s.duration for s in llm.engine.step_records[first:] if s.num_prefill_tokens == 0]
        return steps, [o.token_ids for o in outs]

    for version in versions:
        run(version, 1)                                      # warm-up
    for batch in args.batch_sizes:
        times, tokens = {v: [] for v in versions}, {}
        for _ in range(args.reps):
            for version in versions:
                steps, tokens[version] = run(version, batch)
                times[version].extend(steps)
        if tokens["before"] != tokens["after"]:
            raise SystemExit(f"batch {batch}: the two versions generated different tokens")
        ms = {v: 1e3 * statistics.median(t) for v, t in times.items()}
        print(f"batch {batch:2d}: decode step median before {ms['before']:6.1f} ms, after {ms['after']:6.1f} ms "
              f"({ms['after'] / ms['before']:.3f}x), same tokens")
    for version in versions:
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            run(version, 1, tokens=9)
        calls = sum(event.count for event in prof.key_averages() if event.key.startswith("aten::"))
        print(f"{version}: {calls / 9:.0f} torch operator calls per step of one 9-token request (prefill included, nested calls counted)")


if __name__ == "__main__":
    main()
