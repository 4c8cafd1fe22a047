"""Notebook 2, exercise 3: the probability that the first step keeps its (one-hot) first draft,
predicted from the target's exact probabilities and measured by sampling, in the experiment of §4.

Run from tutorials/: python solutions/02_one_hot_acceptance.py
"""

import functools
import sys
from pathlib import Path

sys.path.insert(0, str(Path.cwd().parent))  # the repository root, as the notebooks do

import torch

from dflash.drafter import Drafter, DrafterConfig
from dflash.qwen3 import Qwen3, Qwen3Config
from generate import ModelRunner, generate_dflash

torch.set_grad_enabled(False)
torch.set_num_threads(1)  # tiny models: one thread is as fast, and far steadier on a busy shared machine
VOCAB, PROMPT, TEMPERATURE = 8, [1, 5, 2, 6], 1.0

# The notebook's tiny target and stand-in drafter, built from the same seed.
small = Qwen3Config(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                    num_attention_heads=2, num_key_value_heads=1, head_dim=16)
torch.manual_seed(0)
tiny_target = Qwen3(small).eval()
tiny_target.lm_head.weight.mul_(4)
tiny_drafter = Drafter(DrafterConfig(layers=Qwen3Config(**{**vars(small), "num_hidden_layers": 1}), block_size=4,
                                     num_target_layers=2, mask_token_id=0, target_layer_ids=[0, 1])).eval()


@functools.cache
def greedy_next(prefix: tuple) -> int:
    hidden, _ = tiny_target(torch.tensor([prefix]))  # (1, len, hidden)
    return tiny_target.logits(hidden[0, -1]).argmax().item()


class GreedyGuessRunner(ModelRunner):
    """Drafts the target's greedy continuation of the committed text (the drafter pass still runs)."""

    committed: list

    def draft(self, context_features, last_token, start):
        super().draft(context_features, last_token, start)
        guess = list(self.committed)
        for _ in range(self.block_size - 1):
            guess.append(greedy_next(tuple(guess)))
        self.block_ids[0, 1:] = torch.tensor(guess[len(self.committed):])  # (block - 1,)
        return self.block_ids[0, 1:]


def next_probabilities(prefixes):
    ids = torch.tensor([PROMPT + list(prefix) for prefix in prefixes])  # (prefixes, len)
    hidden, _ = tiny_target(ids)  # (prefixes, len, hidden)
    return torch.softmax(tiny_target.logits(hidden[:, -1]).double() / TEMPERATURE, dim=-1)  # (prefixes, VOCAB)


def first_draft_kept(samples):
    """(predicted, measured) probability that the first step keeps its first draft."""
    p1 = next_probabilities([()])[0]  # (V,): t1 after the prompt
    p2 = next_probabilities([(a,) for a in range(VOCAB)])  # (V, V): t2 after the prompt and t1 = a
    predicted = (p1 * p2.max(dim=-1).values).sum().item()  # the draft after t1 is argmax p2[t1]: kept w.p. max p2[t1]
    runner = GreedyGuessRunner(tiny_target, tiny_drafter, max_length=len(PROMPT) + 3 + 4)
    generator = torch.Generator().manual_seed(0)
    kept = 0
    for _ in range(samples):
        runner.committed = list(PROMPT)
        result = generate_dflash(tiny_target, tiny_drafter, PROMPT, 3, temperature=TEMPERATURE, generator=generator,
                                 runner=runner, on_token=lambda token, drafted: runner.committed.append(token))
        kept += result.acceptance_lengths[0] >= 2
    return predicted, kept / samples


SAMPLES = 600
predicted, measured = first_draft_kept(SAMPLES)
sigma = (predicted * (1 - predicted) / SAMPLES) ** 0.5
print(f"first draft kept: predicted {predicted:.3f}, measured {measured:.3f} over {SAMPLES} runs (+- {sigma:.3f})")
assert abs(measured - predicted) < 4 * sigma, "the measured share lies within 4 standard deviations of the prediction"
print("checks passed")
