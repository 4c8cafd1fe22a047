"""Grades lab 06_sampled_rule against the library's own rule, simulated: `dflash.sampling.verdicts` judges many
independent slots (drafts drawn from q, or q's argmax for greedy drafts), and the committed tokens' frequencies
and the share of drafts kept must match the student's exact law and keep probabilities."""

import torch

from dflash.sampling import verdicts

SLOTS = 200_000
PAIRS = [([0.9, 0.05, 0.05], [0.5, 0.3, 0.2]), ([0.4, 0.3, 0.3], [0.4, 0.3, 0.3]),
         ([0.5, 0.3, 0.15, 0.05], [0.1, 0.2, 0.3, 0.4]), ([0.2, 0.0, 0.8], [0.6, 0.4, 0.0])]


def simulate(p: torch.Tensor, q: torch.Tensor, generator: torch.Generator):
    """(committed tokens' frequencies, share kept by sampled drafts, share kept by greedy drafts) over SLOTS slots."""
    p_slots, q_slots = p.expand(SLOTS, len(p)), q.expand(SLOTS, len(q))  # (SLOTS, vocab) each
    drafts = torch.multinomial(q, SLOTS, replacement=True, generator=generator)  # (SLOTS,)
    committed = verdicts(p_slots, drafts, q_slots, generator)  # (SLOTS,)
    greedy = q.argmax().expand(SLOTS)  # (SLOTS,)
    greedy_kept = (verdicts(p_slots, greedy, None, generator) == greedy).double().mean().item()
    frequencies = torch.bincount(committed, minlength=len(p)).double() / SLOTS
    return frequencies, (committed == drafts).double().mean().item(), greedy_kept


def test_sampled_rule(lab):
    generator = torch.Generator().manual_seed(0)
    for _ in range(100):  # random pairs of varied sharpness: the law must be p exactly
        p, q = (torch.rand(10, dtype=torch.float64, generator=generator).softmax(0) ** 3 for _ in range(2))
        p, q = p / p.sum(), q / q.sum()  # (10,) each
        assert torch.allclose(lab.committed_law(p, q), p, atol=1e-12), \
            "06_sampled_rule: the committed law should be the target's p"
    tolerance = 5 * (0.25 / SLOTS) ** 0.5  # five standard deviations of a share at its widest
    for p, q in PAIRS:
        p, q = torch.tensor(p, dtype=torch.float64), torch.tensor(q, dtype=torch.float64)
        frequencies, sampled, greedy = simulate(p, q, generator)
        law = lab.committed_law(p, q)
        assert (law - frequencies).abs().max() < tolerance, \
            f"06_sampled_rule: for p {p.tolist()}, q {q.tolist()} your law {law.tolist()}; " \
            f"verdicts commit {frequencies.tolist()}"
        mine_greedy, mine_sampled = lab.keep_probabilities(p, q)
        assert abs(mine_sampled - sampled) < tolerance, \
            f"06_sampled_rule: sampled drafts kept {mine_sampled:.3f} for p {p.tolist()}, q {q.tolist()}; " \
            f"verdicts keep {sampled:.3f}"
        assert abs(mine_greedy - greedy) < tolerance, \
            f"06_sampled_rule: greedy drafts kept {mine_greedy:.3f} for p {p.tolist()}, q {q.tolist()}; " \
            f"verdicts keep {greedy:.3f}"
