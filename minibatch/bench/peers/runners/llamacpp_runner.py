"""Serves the benchmark's jobs with llama.cpp (llama-cpp-python), one request at a time: greedy, EOS ignored.

The benchmark starts it as `.peers/llamacpp/bin/python llamacpp_runner.py` (see runner_protocol for the
conversation). The spec names the shipped GGUF file (SmolLM2-135M-Instruct in Q4_1), the weight format to
run ("f32", "bf16", "q8_0" or "q4_1"), a folder for converted copies, the context length and the threads.
A format other than the file's own is written once by llama.cpp's own quantizer (requantizing allowed: F32
and BF16 hold the Q4_1 weights dequantised, Q8_0 requantises them) and kept in the folder.
"""
from __future__ import annotations

import ctypes
import os
from pathlib import Path

from runner_protocol import serve

FTYPES = {"f32": "LLAMA_FTYPE_ALL_F32", "bf16": "LLAMA_FTYPE_MOSTLY_BF16", "q8_0": "LLAMA_FTYPE_MOSTLY_Q8_0",
          "q4_1": "LLAMA_FTYPE_MOSTLY_Q4_1"}


def gguf_in_format(source: Path, fmt: str, folder: Path, threads: int) -> Path:
    """The model in `fmt`: the source itself when it already is, else a converted copy in `folder`."""
    import llama_cpp
    if source.name.endswith(f".{fmt.upper()}.gguf"):
        return source
    target = folder / source.name.replace(".Q4_1.gguf", f".{fmt.upper()}.gguf")
    if not target.is_file():
        folder.mkdir(parents=True, exist_ok=True)
        params = llama_cpp.llama_model_quantize_default_params()
        params.ftype, params.allow_requantize, params.nthread = getattr(llama_cpp, FTYPES[fmt]), True, threads
        partial = target.with_suffix(f".{os.getpid()}.tmp")
        if llama_cpp.llama_model_quantize(str(source).encode(), str(partial).encode(), ctypes.byref(params)) != 0:
            raise RuntimeError(f"llama.cpp could not write {fmt} from {source}")
        partial.rename(target)                                          # complete, or not there at all
    return target


def load(spec: dict):
    import llama_cpp
    path = gguf_in_format(Path(spec["gguf"]), spec["format"], Path(spec["folder"]), spec["threads"])
    llm = llama_cpp.Llama(model_path=str(path), n_ctx=spec["n_ctx"], n_threads=spec["threads"],
                          n_threads_batch=spec["threads"], seed=0, verbose=False)
    generate(llm, [[1, 2, 3, 4]], [4], 1)                               # warm-up, not timed
    return llm, {"version": llama_cpp.__version__, "gguf": str(path), "weight_bytes": int(llm._model.size())}


def generate(llm, prompts: list, output_lens: list, batch_size: int) -> list:
    """One request after the other, whatever the batch size asked (the benchmark asks for 1)."""
    outputs = []
    for prompt, n in zip(prompts, output_lens):                         # in arrival order
        tokens = []
        for token in llm.generate(prompt, top_k=1, top_p=1.0, min_p=0.0, temp=0.0, repeat_penalty=1.0, reset=True):
            tokens.append(token)                                        # EOS included: only the count stops it
            if len(tokens) == n:
                break
        outputs.append(tokens)
    return outputs


if __name__ == "__main__":
    raise SystemExit(serve(load, generate))
