"""Grades lab 02_roofline_other_gpu by the roofline's two limits: on a GPU with unlimited FLOP/s a pass takes
its read time, with unlimited bandwidth its compute time, and on a real one the bound that binds. flat_until is
checked at its edge (k passes, k + 1 does not) and against the GPUs' ridge points."""

import math

from _lab_helpers import drawn_random, qwen3_8b_counts


def drawn_gpu(rng) -> dict:
    """A made-up GPU, drawn at run time: 1 to 8 TB/s, 100 to 2000 TFLOP/s."""
    return dict(name="a drawn GPU", bandwidth=rng.uniform(1e12, 8e12),
                flops=rng.uniform(100e12, 2000e12))


def test_roofline_other_gpu(lab):
    rng = drawn_random()
    counts = qwen3_8b_counts(context=rng.choice([512, 2048, 8192]))
    h100, a100, other = lab.H100, lab.A100, drawn_gpu(rng)
    for gpu in (h100, a100, other):
        for k in (1, rng.randrange(2, 64), rng.randrange(64, 1024), 1024):
            reading = lab.pass_ms(dict(gpu, flops=math.inf), k, counts)  # memory alone
            computing = lab.pass_ms(dict(gpu, bandwidth=math.inf), k, counts)  # compute alone
            assert math.isclose(reading * 1e-3 * gpu["bandwidth"], counts.bytes_read(k), rel_tol=1e-9), \
                f"02_roofline_other_gpu: with unlimited FLOP/s a pass of {k} tokens should take bytes / bandwidth"
            assert math.isclose(computing * 1e-3 * gpu["flops"], counts.flops(k), rel_tol=1e-9), \
                f"02_roofline_other_gpu: with unlimited bandwidth a pass of {k} tokens should take FLOPs / FLOP/s"
            assert math.isclose(lab.pass_ms(gpu, k, counts), max(reading, computing), rel_tol=1e-9), \
                f"02_roofline_other_gpu: on the {gpu['name']} a pass of {k} tokens is bound by the slower of the two"
    drawn_limit = round(rng.uniform(1.05, 1.3), 2)
    for gpu, limit in ((h100, 1.10), (a100, 1.10), (a100, 1.5), (other, drawn_limit)):
        flat, one = lab.flat_until(gpu, counts, limit), lab.pass_ms(gpu, 1, counts)
        assert 1 <= flat <= 1024 and lab.pass_ms(gpu, flat, counts) <= limit * one, \
            f"02_roofline_other_gpu: a pass of {flat} tokens costs more than {limit} one-token passes"
        assert flat == 1024 or lab.pass_ms(gpu, flat + 1, counts) > limit * one, \
            f"02_roofline_other_gpu: {flat + 1} tokens are still within {limit} one-token passes: not the largest k"
        ridge = gpu["flops"] / gpu["bandwidth"]  # FLOPs per byte where compute catches up with reading
        assert limit > 1.2 or gpu is other or 0.5 * ridge < flat < 2 * ridge, \
            "02_roofline_other_gpu: the flat stretch ends near the ridge"
    assert lab.flat_until(a100, counts) < lab.flat_until(h100, counts), \
        "02_roofline_other_gpu: the A100 does fewer FLOPs per byte: its pass should stop being flat sooner"
