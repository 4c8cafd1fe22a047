"""Grades lab 06_sampled_rule against the library's own rule, simulated: `dflash.sampling.verdicts`
judges many independent slots (drafts drawn from q, or q's argmax for greedy drafts), on laws drawn
at run time. How often each token is committed as a kept draft, and as a replacement, must match the
student's exact parts, and the share of drafts kept the student's keep probabilities. Exact means
exact: a part no slot could reach (more of a token kept than drafted, or than the target allows),
keep probabilities that are not the sum of the kept parts, or a greedy probability that is no law's
entry, is an estimate, however close to the simulation."""

import torch

from _lab_helpers import drawn_generator
from dflash.sampling import verdicts

SLOTS = 200_000
TOLERANCE = 5 * (0.25 / SLOTS) ** 0.5  # five standard deviations of a share at its widest


def drawn_laws(generator: torch.Generator) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(p, q) pairs of varied sharpness over 3 to 8 tokens, some with tokens one of them never
    draws."""
    pairs = []
    for sharpness in (1, 3, 3, 6):
        vocab = int(torch.randint(3, 9, (1,), generator=generator))
        p, q = (
            torch.rand(vocab, dtype=torch.float64, generator=generator) ** sharpness
            for _ in range(2)
        )
        if sharpness == 6:
            p[0], q[1] = 0.0, 0.0
            p[2] = q[2] = 0.0  # a token neither law draws: p / q is 0 / 0 there
        pairs.append((p / p.sum(), q / q.sum()))
    return pairs


def simulate(p: torch.Tensor, q: torch.Tensor, generator: torch.Generator):
    """(kept drafts' frequencies, replacements' frequencies, share kept by greedy drafts) over SLOTS
    slots."""
    p_slots, q_slots = p.expand(SLOTS, len(p)), q.expand(SLOTS, len(q))  # (SLOTS, vocab) each
    drafts = torch.multinomial(q, SLOTS, replacement=True, generator=generator)  # (SLOTS,)
    committed = verdicts(p_slots, drafts, q_slots, generator)  # (SLOTS,)
    kept = committed == drafts  # (SLOTS,)
    greedy = q.argmax().expand(SLOTS)  # (SLOTS,)
    greedy_kept = (verdicts(p_slots, greedy, None, generator) == greedy).double().mean().item()

    def frequencies(where):
        return torch.bincount(committed[where], minlength=len(p)).double() / SLOTS  # (vocab,)

    return frequencies(kept), frequencies(~kept), greedy_kept


def test_sampled_rule(lab):
    generator = drawn_generator()
    for p, q in drawn_laws(generator):
        kept, replaced, greedy = simulate(p, q, generator)
        mine_kept, mine_replaced = lab.committed_parts(p, q)
        assert torch.isfinite(mine_kept).all() and torch.isfinite(mine_replaced).all(), (
            "06_sampled_rule: a part is not a number for a token neither law draws (0 / 0?)")
        for name, mine, seen in (("kept", mine_kept, kept), ("replaced", mine_replaced, replaced)):
            assert mine.shape == p.shape, (
                f"06_sampled_rule: {name} should be (vocab,), not {tuple(mine.shape)}"
            )
            token = int((mine - seen).abs().argmax())
            assert (mine - seen).abs().max() < TOLERANCE, (
                f"06_sampled_rule: {name}[{token}] is {mine[token].item():.4f} for a drawn pair of "
                "laws over "
                f"{len(p)} tokens: more than five standard errors from how often verdicts commit "
                f"token {token} "
                f"that way"
            )
        assert (mine_kept <= torch.minimum(p, q) + 1e-12).all(), (
            "06_sampled_rule: kept holds a token more often than a slot drafts it or than the rule "
            "keeps it: compute the parts exactly, do not sample them")
        mine_greedy, mine_sampled = lab.keep_probabilities(p, q)
        assert abs(mine_sampled - mine_kept.sum().item()) < 1e-9, (
            "06_sampled_rule: your sampled keep probability is not the total of your kept parts")
        assert any(abs(mine_greedy - chance) < 1e-12 for chance in p.tolist()), (
            "06_sampled_rule: your greedy keep probability is an estimate: it can be computed "
            "exactly")
        for rule, mine, seen in (
            ("greedy", mine_greedy, greedy),
            ("sampled", mine_sampled, kept.sum().item()),
        ):
            assert abs(mine - seen) < TOLERANCE, (
                f"06_sampled_rule: {rule} drafts kept with probability {mine:.4f} for a drawn pair "
                "of laws over "
                f"{len(p)} tokens: more than five standard errors from the share verdicts keeps"
            )
