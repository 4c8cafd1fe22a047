"""Lab 03_one_layer (notebook 3, section 1): which of the target's layers does the drafter need?

Write the function below, then grade it: python -m pytest tutorials/labs -k one_layer
"""

import torch  # noqa: F401

from generate import ModelRunner  # noqa: F401  (the runner to subclass)


def tau_with_one_layer(pair, pooled_tau) -> dict[int, float]:
    """{target layer id: pooled tau when the drafter sees only that layer's features}.

    The drafter reads the layers `pair.drafter.config.target_layer_ids`, side by side in each feature
    vector: the first `pair.target.config.hidden_size` numbers come from the first layer, the next from the
    second. For each layer, keep its part and zero the others (a `ModelRunner` subclass whose `draft`
    multiplies the features by a 0/1 vector, as in lab 03_zero_context), and pool tau with `pooled_tau`.
    """
    raise NotImplementedError
