"""The reference model's public path, kept where the course and outside checks import it from:

    from minibatch.models import load_hf      # (transformers model, tokenizer): the reference

The models themselves live in `minibatch.engine.models`.
"""
from minibatch.engine.models import load_hf

__all__ = ["load_hf"]
