"""Grades lab 05_int_positions with a backend that records what it is given: the counts must be the backend's own
after each step, every compiled graph must be one step (the position baked in as a constant, no position
input), and each step must have added one, since each step's position is new."""

from _lab_helpers import ROOT, drawn_seed
from dflash.qwen3 import Qwen3


class RecordingBackend:
    """A torch.compile backend that runs each graph as traced and keeps its inputs' shapes."""

    def __init__(self):
        self.inputs: list[list[tuple]] = []

    @property
    def graphs(self) -> int:
        return len(self.inputs)

    def __call__(self, graph_module, example_inputs):
        self.inputs.append([tuple(getattr(x, "shape", ())) for x in example_inputs])
        return graph_module.forward


def test_int_positions(lab):
    backend = RecordingBackend()
    small = Qwen3.from_pretrained(ROOT / "tests/fixtures/qwen3-tiny")  # 4 layers: each graph traces in a second
    steps = 2 + drawn_seed() % 3  # drawn at run time
    counts = lab.graphs_with_int_positions(small, backend, steps)
    assert len(counts) == steps, \
        f"05_int_positions: one count per step, {len(counts)} for {steps} steps"
    assert counts[-1] == backend.graphs, "05_int_positions: return counter.graphs after each step"
    assert all(shape != (1,) for graph in backend.inputs for shape in graph if len(shape) == 1), \
        "05_int_positions: a graph took a (1,) positions tensor: pass the position as a Python int"
    assert all(later == earlier + 1 for earlier, later in zip([0] + list(counts), counts)), \
        f"05_int_positions: graphs after each step {counts}: every step's position is a new int, so a new graph"
