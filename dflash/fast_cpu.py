"""The memory floor of a decode on a CPU, and the fast plain loop measured against it.

A decode at batch 1 reads every weight once and does two flops per weight read: on a CPU core it
waits on memory, not on arithmetic. Its floor is the time to read the weights at the speed this
core reads memory: `floor_ms = decode_weight_bytes / read_bandwidth`. A decode's `decode_of_floor`
(floor_ms / decode_ms) says how much of that speed the loop gets; 1.0 is as fast as the memory
allows, whatever the code.

The fast loop itself is the runner's compiled passes with `dflash.compiled.FROZEN` (inductor with
the weights frozen into the graph): `runner_options` gives a runner's options for it.

What each candidate measured at Qwen3-0.6B in float32 (random weights, context 128, one thread,
the process's CPU time, least of 4 to 8 rounds, on a shared 2-core Xeon @ 2.80GHz with AVX-512 but
no bf16 units, load average 3 to 9; the floor 177 ms: 2.38 GB at the 13.5 GB/s of a 1 GiB GEMV):

| passes (ms)                          | decode      | verify 16 | draft 16 |
|--------------------------------------|-------------|-----------|----------|
| eager                                | 219 (81 %)  | 524       | 324      |
| inductor                             | 195 (91 %)  | 530       | 342      |
| inductor, weights frozen (`FROZEN`)  | 205 (86 %)  | 381       | 140      |

Frozen, inductor lays every linear's weight out for MKL's packed GEMM once: 1.4x a 16-token
matmul, 0.8x a one-token one (a GEMV already reads at the memory's speed in float32). Fusing the
q/k/v and the gate/up projections changed nothing measurable (within 3 %, either way); int8
weight-only matmuls (`torch._weight_int8pack_mm`, float32 activations) were 4x slower for one
token and 28x for 16 on this CPU: neither is adopted. On a CPU with bf16 units the eager bf16 GEMV
is the slow part and freezing pays for the decode too (issue #46: 162 -> 97 ms); bf16 is emulated
here, so those figures cannot be measured on this machine.
"""

from __future__ import annotations

import time
from typing import Callable

import torch

from dflash.compiled import FROZEN
from dflash.qwen3 import Qwen3

PROBE_BYTES = 2**30  # the probes read 1 GiB: far past every cache, as a decode's weights are


def decode_weight_bytes(target: Qwen3) -> int:
    """The bytes of weights one decode reads: every layer's and the final norm's, the LM head's
    whole matrix, and one row of the embedding. Tied, the head's matrix is the embedding's, read
    once by the head; untied, the embedding's other rows are never read."""
    bytes_of = lambda tensor: tensor.numel() * tensor.element_size()  # noqa: E731
    every, embedding = sum(bytes_of(p) for p in target.parameters()), target.embed_tokens.weight
    if target.lm_head is None:  # tied: the head reads the embedding's matrix whole
        return every
    return every - bytes_of(embedding) + bytes_of(embedding[0])


def least_seconds(run: Callable[[], object], rounds: int, clock: Callable[[], float]) -> float:
    """The least time of `rounds` runs of `run` on `clock`: a shared machine only ever adds time."""
    best = float("inf")
    for _ in range(rounds):
        began = clock()
        run()
        best = min(best, clock() - began)
    return best


def read_bandwidth(rounds: int = 5, clock: Callable[[], float] = time.process_time,
                   size: int = PROBE_BYTES) -> dict:
    """Bytes per second this process reads from memory with torch's threads, by two probes over
    `size` bytes of float32: a sum (the issue's probe) and a matrix-vector product (what a decode
    does, in rows of 1,024). The faster is the machine's read speed: a decode's floor must not be
    beaten by the decode itself. In GB/s (10^9 bytes)."""
    data = torch.ones(size // 4)
    rows = data.view(-1, 1024)
    vector = torch.ones(1024)
    sum_s = least_seconds(data.sum, rounds, clock)
    gemv_s = least_seconds(lambda: torch.mv(rows, vector), rounds, clock)
    speeds = {"sum_gb_per_s": size / sum_s / 1e9, "gemv_gb_per_s": size / gemv_s / 1e9}
    return {**speeds, "read_gb_per_s": max(speeds.values()), "probe_bytes": size}


def floor_fields(weight_bytes: int, read_gb_per_s: float, decode_ms: float) -> dict:
    """A row's floor: the weights a decode reads, the read speed, the time to read them once
    (floor_ms) and the share of that speed the decode gets (decode_of_floor)."""
    floor_ms = weight_bytes / (read_gb_per_s * 1e9) * 1e3
    return {"weight_bytes": weight_bytes, "read_gb_per_s": read_gb_per_s, "floor_ms": floor_ms,
            "decode_of_floor": floor_ms / decode_ms}


def runner_options(compile: bool, device: torch.device | str = "cpu") -> dict:
    """ModelRunner's options for the fastest loop on `device`: eager; or compiled, on a CPU with the
    weights frozen (`FROZEN`), on a GPU as CUDA graphs. generate.py's one call for its runner."""
    if not compile:
        return {"compile": False}
    if torch.device(device).type == "cpu":
        return {"compile": True, "backend": FROZEN}
    return {"compile": True, "mode": "reduce-overhead"}
