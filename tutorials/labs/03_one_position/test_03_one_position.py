"""Grades lab 03_one_position: the drafter must be called with every mask slot at n + 1, the guesses
must be what that call's output says, and they must all be one token (while at their own
positions the slots differ); on the demo pair, then on the fixture pair (another block size and
vocabulary)."""

from unittest import mock

import torch

from _lab_helpers import drawn_random, fixture_pair
from dflash.drafter import Drafter


def graded_once(lab, demo, prompt_ids: list[int], own_positions: bool = True) -> bool:
    """Grade one prompt; True when the slots' guesses could be told from slot 0's (a guess read one
    slot off shows only then). `own_positions`: also check that at their own positions the slots
    guess apart (the demo pair's, trained; not a random pair's)."""
    calls = []
    forward = Drafter.forward

    def watched(self, features, block_embeddings, context_positions, block_positions, *args, **kwargs):
        out = forward(self, features, block_embeddings, context_positions, block_positions, *args, **kwargs)
        calls.append((features, block_embeddings, context_positions, block_positions, out))
        return out

    n, block = len(prompt_ids), demo.block
    with mock.patch.object(Drafter, "forward", watched):
        guesses = lab.guesses_at_one_position(demo, prompt_ids)
    one_position = [n] + [n + 1] * (block - 1)
    at_one = [call for call in calls if call[3].tolist() == one_position]
    assert at_one, (f"03_one_position: the drafter was called with block positions "
                    f"{[call[3].tolist() for call in calls]}; slot 0 at n = {n}, every mask slot at n + 1")
    features, embedded, context_positions, block_positions, out = at_one[-1]
    assert context_positions.tolist() == list(range(n)), "03_one_position: the context sits at 0..n-1"
    # (block,): every slot's guess in that call
    read = demo.target.logits(out[0]).argmax(-1).tolist()
    assert list(guesses) == read[1:], \
        "03_one_position: the guesses are the argmax of target.logits over the mask slots' outputs"
    assert len(guesses) == block - 1 and len(set(guesses)) == 1, \
        f"03_one_position: slots that share a position share every vector: one guess for all, got {guesses}"
    if own_positions:
        # at their own positions
        own = demo.drafter(features, embedded, context_positions, n + torch.arange(block))
        assert len(set(demo.target.logits(own[0, 1:]).argmax(-1).tolist())) > 1, \
            "03_one_position: at their own positions the slots should guess different tokens"
    return read[0] != read[1]


def test_one_position(lab, demo):
    rng = drawn_random()
    # held-out problems drawn at run time, until one tells slot 0 from the mask slots
    for _ in range(8):
        if graded_once(lab, demo, demo.drawn_prompt(rng)):
            break
    # and a pair of another block size and vocabulary: nothing of the demo's may be written down
    pair = fixture_pair()
    graded_once(lab, pair, pair.drawn_prompt(rng), own_positions=False)
