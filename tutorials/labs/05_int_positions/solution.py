"""Lab 05_int_positions, the reference answer (notebook 5, section 5): positions as Python ints.

dynamic=False specialises the graph on every Python number it reads, so a position that changes at
every step is a new constant, and a new graph, at every step. A position tensor is data: one graph
serves every step (notebook 5's decode_steps(True)).
"""

import torch


def graphs_with_int_positions(target, counter, steps: int = 4) -> list[int]:
    torch.compiler.reset()
    cache = target.new_cache(32)
    cache.read_limit = cache.max_length  # the whole buffer, masked by position: one shape

    def step(token, position):
        positions = torch.arange(position, position + 1)  # (1,): a Python int baked into the graph
        return target.logits(target(token, positions, cache)[0])  # (1, 1, vocab)

    compiled = torch.compile(step, backend=counter, dynamic=False, fullgraph=True)
    logits = target.logits(target(torch.tensor([[5, 6, 7]]), torch.arange(3), cache)[0])  # an eager prefill
    cache.commit(3)
    counts = []
    for _ in range(steps):
        token = logits[:, -1].argmax(-1, keepdim=True)  # (1, 1)
        logits = compiled(token, cache.length)
        cache.commit(1)
        counts.append(counter.graphs)
    return counts
