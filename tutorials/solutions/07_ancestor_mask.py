"""Notebook 7, exercise 2: the ancestor mask from the parents, checked against the verify pass's mask.

Run from tutorials/: python solutions/07_ancestor_mask.py
"""

import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path.cwd().parent))  # the repository: dflash/

from dflash.tree import DraftTree, ancestor_mask, verify_inputs


def my_ancestor_mask(parents):
    """mask[i][j]: node j is node i or one of its ancestors (follow the parents up to the root, whose parent is -1)."""
    mask = []
    for node in range(len(parents)):
        row, walker = [False] * len(parents), node
        while walker >= 0:
            row[walker] = True
            walker = parents[walker]
        mask.append(row)
    return mask


rng = random.Random(0)
for _ in range(200):  # random trees: parents come first, as build_tree adds them
    tree = DraftTree.rooted_at(0)
    for _ in range(rng.randrange(0, 40)):
        tree.add(rng.randrange(100), rng.randrange(len(tree.tokens)), 0.0)
    assert my_ancestor_mask(tree.parents) == ancestor_mask(tree.parents)
    _, _, mask = verify_inputs(tree, 40)  # the verify pass's mask, padded to a budget of 40
    size = len(tree.tokens)
    assert my_ancestor_mask(tree.parents) == mask[:size, :size].tolist()
print("my_ancestor_mask == ancestor_mask == the verify pass's mask on 200 random trees")
