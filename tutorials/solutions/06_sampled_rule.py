"""Notebook 6, exercise 3: the sampled-draft rule commits exactly p; when it keeps more than greedy drafts.

Run from tutorials/: python solutions/06_sampled_rule.py
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path.cwd().parent))  # the repository: dflash/

import torch

from dflash.sampling import verdicts


def committed_law(p, q):
    """P(commit x) = P(draw x from q and keep it) + P(reject) * residual(x), exactly."""
    kept = torch.where(q > 0, q * torch.clamp(p / q, max=1.0), 0.0)  # (vocab,): q(x) min(1, p(x)/q(x)) = min(p, q)
    excess = (p - q).clamp(min=0.0)  # (vocab,)
    rejected = 1 - kept.sum()  # = excess.sum()
    residual = excess / excess.sum() if excess.sum() > 0 else torch.zeros_like(p)
    return kept + rejected * residual


def keep_probabilities(p, q):
    """(greedy rule: p(argmax q), sampled rule: sum min(p, q))."""
    return p[q.argmax()].item(), torch.minimum(p, q).sum().item()


generator = torch.Generator().manual_seed(0)
for _ in range(100):
    p = torch.rand(10, dtype=torch.float64, generator=generator).softmax(0) ** 3
    q = torch.rand(10, dtype=torch.float64, generator=generator).softmax(0) ** 3
    p, q = p / p.sum(), q / q.sum()  # (10,) each, of varied sharpness
    assert torch.allclose(committed_law(p, q), p), "the committed law must be p"

# The library's own rule, simulated: 200,000 independent slots, each drafting from q and judged by `verdicts`.
p, q = torch.tensor([0.5, 0.3, 0.15, 0.05], dtype=torch.float64), torch.tensor([0.1, 0.2, 0.3, 0.4], dtype=torch.float64)
slots = 200_000
drafts = torch.multinomial(q, slots, replacement=True, generator=generator)  # (slots,)
committed = verdicts(p.expand(slots, 4), drafts, q.expand(slots, 4), generator)  # (slots,)
frequencies = torch.bincount(committed, minlength=4).double() / slots
assert (frequencies - p).abs().max() < 0.005, f"verdicts' committed tokens {frequencies} do not follow p {p}"
print("committed_law(p, q) == p for 100 random pairs; verdicts commits", [round(f, 3) for f in frequencies.tolist()],
      "for p", p.tolist())

cases = {"(a) sure target, unsure drafter": ([0.9, 0.05, 0.05], [0.5, 0.3, 0.2]),
         "(b) both unsure and alike": ([0.4, 0.3, 0.3], [0.4, 0.3, 0.3])}
for name, (p, q) in cases.items():
    greedy, sampled = keep_probabilities(torch.tensor(p), torch.tensor(q))
    print(f"{name}: greedy keeps {greedy:.2f}, sampled keeps {sampled:.2f}")
greedy_a, sampled_a = keep_probabilities(*map(torch.tensor, cases["(a) sure target, unsure drafter"]))
greedy_b, sampled_b = keep_probabilities(*map(torch.tensor, cases["(b) both unsure and alike"]))
assert greedy_a > sampled_a and sampled_b > greedy_b  # neither rule wins everywhere
