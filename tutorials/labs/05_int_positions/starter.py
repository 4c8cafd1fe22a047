"""Lab 05_int_positions (notebook 5, section 5; about 15 minutes): what torch.compile does with a Python int
that changes at every step.

Write the function below, then grade it: python -m pytest tutorials/labs -k int_positions
"""

import torch  # noqa: F401


def graphs_with_int_positions(target, counter, steps: int = 4) -> list[int]:
    """The graph count (`counter.graphs`) after each of `steps` compiled decode steps of `target`.

    As notebook 5's `decode_steps(True)`: `torch.compiler.reset()`; a cache `target.new_cache(32)` with
    `fixed_shape = True`; an eager prefill of the ids [[5, 6, 7]] at positions 0..2, then `cache.extend(3)`;
    then, `steps` times, the greedy next token through the compiled step and `cache.extend(1)`. Compile it
    with `torch.compile(step, backend=counter, dynamic=False, fullgraph=True)`, but let `step(token, position)`
    take the position as a Python int and build the positions tensor inside:
    `torch.arange(position, position + 1)`. What does torch.compile do with a Python number it sees change?
    """
    raise NotImplementedError
