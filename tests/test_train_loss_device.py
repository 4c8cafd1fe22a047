"""The chunked LM-head loss builds every tensor on its inputs' device: an index made on the CPU for
a CUDA tensor is a host-to-device copy, and a sync, per loss chunk. Checked without a GPU: the
inputs live on the `meta` device, and every tensor an operation returns is recorded."""

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from dflash.train_kernels import chunked_lm_head_loss


class Devices(TorchDispatchMode):
    """The devices of every tensor the operations inside the block return."""

    def __init__(self):
        super().__init__()
        self.seen = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        self.seen |= {leaf.device.type for leaf in tree_leaves(out) if isinstance(leaf, torch.Tensor)}
        return out


def test_the_chunked_loss_makes_no_tensor_off_its_device():
    hidden = torch.empty(10, 8, device="meta", requires_grad=True)
    head, labels = torch.empty(50, 8, device="meta"), torch.zeros(10, dtype=torch.long, device="meta")
    with Devices() as devices:
        loss, hits = chunked_lm_head_loss(hidden, head, labels, torch.ones(10, device="meta"), chunk_size=4)
        loss.backward()
    assert devices.seen == {"meta"}
