"""Input-grounded prompts: tasks whose answer draws on a text given in the prompt (edit, summarise, extract).

Their answers copy much of the prompt, which is where speculative decoding by prompt lookup shines
(`minibatch.bench.speculative`), and they are the long documents of the capstone's workload.
"""
from __future__ import annotations

from minibatch.workloads import load_prompts

TYPOS = {"council": "councel", "proposals": "propossals", "building": "bulding", "several": "severel",
         "affordable": "afordable", "visitors": "visiters", "engineer": "enginer"}


def edit_prompt() -> str:
    """An editing task: correct the spelling of a shipped passage into which TYPOS were put."""
    passage = load_prompts("summarise")[0].split("\n\n", 1)[1]
    for right, wrong in TYPOS.items():
        passage = passage.replace(right, wrong)
    return "Correct the spelling mistakes in the text below and write the corrected text out in full.\n\n" + passage


def grounded_prompts() -> list[str]:
    """Prompts whose answer draws on a text given in the prompt: editing, summarising, extracting."""
    return [edit_prompt()] + load_prompts("summarise") + load_prompts("extract")
