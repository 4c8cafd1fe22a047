"""Notebook 5, exercise 3: positions passed as Python ints make torch.compile trace a graph per step.

dynamic=False specialises the graph on every Python number it reads, so a position that
changes at every step is a new constant, and a new graph, at every step. A position tensor is
data: one graph serves every step (the notebook's decode_steps(True)).

Run from tutorials/: python solutions/05_int_positions.py
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path.cwd().parent))  # the repository root, as the notebooks do

import torch

from dflash.qwen3 import Qwen3

torch.set_grad_enabled(False)
torch.set_num_threads(1)  # tiny models: one thread is as fast, and far steadier on a busy shared machine
target = Qwen3.from_pretrained(Path.cwd().parent / "weights/tiny-qwen3")


class CountingBackend:
    """A torch.compile backend that counts the graphs it is given and runs each as traced."""

    def __init__(self):
        self.graphs = 0

    def __call__(self, graph_module, example_inputs):
        self.graphs += 1
        return graph_module.forward


def graph_counts(position_as_int: bool, steps: int = 4) -> list[int]:
    torch.compiler.reset()
    counter = CountingBackend()
    cache = target.new_cache(32)
    cache.fixed_shape = True  # the whole buffer, masked by position: the shapes never change

    def step(token, position):
        positions = torch.arange(position, position + 1) if position_as_int else position  # (1,)
        return target.logits(target(token, positions, cache)[0])  # (1, 1, vocab)

    compiled = torch.compile(step, backend=counter, dynamic=False, fullgraph=True)
    logits = target.logits(target(torch.tensor([[5, 6, 7]]), torch.arange(3), cache)[0])  # an eager prefill
    cache.extend(3)
    counts = []
    for _ in range(steps):
        token = logits[:, -1].argmax(-1, keepdim=True)  # (1, 1)
        position = cache.length if position_as_int else torch.tensor([cache.length])
        logits = compiled(token, position)
        cache.extend(1)
        counts.append(counter.graphs)
    return counts


def graphs_with_int_positions(steps=4):
    return graph_counts(True, steps)


as_ints, as_tensor = graphs_with_int_positions(), graph_counts(False)
print(f"graphs after each step: positions as Python ints {as_ints}, as a tensor {as_tensor}")
assert as_ints == [1, 2, 3, 4], "every new int value traces a new graph"
assert as_tensor == [1, 1, 1, 1], "a position tensor keeps one graph"
print("checks passed")
