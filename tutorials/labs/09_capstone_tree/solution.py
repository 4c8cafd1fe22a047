"""Lab 09_capstone_tree, the reference answer: the tree loop, its walk and its commit."""

from dflash.sampling import Sampling
from dflash.tree import build_tree


def my_generate_dflash_tree(runner, prompt_ids: list[int], max_new_tokens: int, budget: int,
                            stop_ids=()) -> tuple[list[int], list[int]]:
    """(new_ids, acceptance_lengths) of greedy DFlash decoding with a draft tree."""
    last, features = runner.prefill(prompt_ids, Sampling(), None)  # int, (1, n, F)
    new_ids, lengths = [last], []
    while len(new_ids) < max_new_tokens and new_ids[-1] not in stop_ids:
        logprobs, candidates = runner.draft_tree(features, last)  # (block - 1, k) each
        tree = build_tree(last, logprobs.tolist(), candidates.tolist(), budget)
        target_tokens = runner.verify_tree(tree, Sampling(), None).tolist()  # (budget + 1,)
        children = {(parent, token): node  # a node, by its parent and its token
                    for node, (parent, token) in enumerate(zip(tree.parents, tree.tokens)) if node}
        path = [0]  # from the root, to the child holding the target's token, while there is one
        while (path[-1], target_tokens[path[-1]]) in children:
            path.append(children[path[-1], target_tokens[path[-1]]])
        features = runner.commit_path(path)
        kept = [target_tokens[node] for node in path]  # the accepted drafts, then the target's own
        lengths.append(len(kept))
        for token in kept:
            if len(new_ids) == max_new_tokens or new_ids[-1] in stop_ids:
                break
            new_ids.append(token)
        last = kept[-1]
    return new_ids, lengths
