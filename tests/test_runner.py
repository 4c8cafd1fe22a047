"""What a reader of one DFlash step meets below `generate_dflash`: few functions, in three files; a
runner nothing outside it changes; attention that keeps SDPA's fused kernels where it can."""

import functools
import os
import sys
from pathlib import Path

import pytest
import torch
from torch.nn.attention.bias import causal_lower_right

import generate
from dflash.drafter import Drafter
from dflash.measure import Oracle, PhaseClock, Timed
from dflash.qwen3 import Qwen3, causal_mask, masked
from generate import ModelRunner, generate_autoregressive, generate_dflash

ROOT = Path(__file__).resolve().parents[1]
WEIGHTS = ROOT / "weights"
MAX_FUNCTIONS = 26  # the project functions a greedy step calls (gpt-fast's: about 15, in 2 files)
STEP_FILES = {"generate.py", "dflash/qwen3.py", "dflash/drafter.py"}
MAX_CALL_FUNCTIONS, MAX_CALL_FILES = 40, 5  # one whole greedy call, its checks included (were 54, 8)
torch.set_num_threads(1)


@pytest.fixture(scope="module")
def demo_pair():
    target = Qwen3.from_pretrained(WEIGHTS / "tiny-qwen3")
    return target, Drafter.from_pretrained(WEIGHTS / "tiny-qwen3-dflash", target=target)


INSTALLED = {"site-packages", "dist-packages"}  # where an environment keeps its packages


@functools.lru_cache(maxsize=None)
def is_project_file(path: str, root: Path = ROOT) -> bool:
    """Whether the code at `path` (a code object's file name) is the project's own. Decided on the
    path's folders, not its text: a virtual environment beside the clone whose name starts like it
    (`dflash-venv` beside `dflash`) passes a text-prefix test, and one inside it (CI's `.venv`)
    lies under the root: both hold torch. Cached, as the profile hook asks once per call."""
    if not os.path.isabs(path):  # "<frozen importlib._bootstrap>", "<string>": no file of ours
        return False
    file = Path(path).resolve()
    if not file.is_relative_to(root):
        return False
    folders = file.relative_to(root).parts[:-1]
    in_environment = bool(folders) and (root / folders[0] / "pyvenv.cfg").is_file()
    return not in_environment and not INSTALLED.intersection(folders)


def project_calls(call, starting_at: str | None = None) -> set[tuple[str, str]]:
    """(file, function) of every project function `call()` calls, from the first call of the
    function named `starting_at` on (None: from the start), traced with a profile hook as
    `sys.setprofile` sees them."""
    calls, started = set(), [starting_at is None]

    def hook(frame, event, arg):
        path, name = frame.f_code.co_filename, frame.f_code.co_qualname
        started[0] = started[0] or name == starting_at
        if started[0] and event == "call" and is_project_file(path):
            calls.add((Path(path).resolve().relative_to(ROOT).as_posix(), name))

    sys.setprofile(hook)
    try:
        call()
    finally:
        sys.setprofile(None)
    return calls


def functions_called_by_the_steps(
    target, drafter, prompt: list[int], new: int
) -> set[tuple[str, str]]:
    """(file, function) of every project function the greedy DFlash steps call after the prefill
    (from the first draft on)."""
    runner = ModelRunner(target, drafter, max_length=len(prompt) + new + 16)
    return project_calls(lambda: generate_dflash(target, drafter, prompt, new, runner=runner),
                         starting_at="ModelRunner.draft")


def test_only_the_clones_own_files_count_as_the_projects(tmp_path):
    """A venv beside the clone whose name starts like it, one inside it, a folder of installed
    packages, or a file name that is no file: none is the project's; its own modules are."""
    root = Path("/x/dflash")
    torch_file = "lib/python3.11/site-packages/torch/nn.py"
    assert is_project_file("/x/dflash/generate.py", root)
    assert is_project_file("/x/dflash/dflash/qwen3.py", root)
    assert not is_project_file(f"/x/dflash-venv/{torch_file}", root)
    assert not is_project_file(f"/x/dflash/.venv/{torch_file}", root)
    assert not is_project_file(f"/x/dflash/env/{torch_file}", root)
    assert not is_project_file("/x/other/generate.py", root)
    assert not is_project_file("<frozen importlib._bootstrap>", root)
    clone = tmp_path / "dflash"  # an environment without a site-packages folder on the path
    (clone / "py").mkdir(parents=True)
    (clone / "py" / "pyvenv.cfg").write_text("home = /usr/bin\n")
    assert not is_project_file(str(clone / "py" / "lib" / "x.py"), clone)
    assert is_project_file(str(clone / "train.py"), clone)


def test_a_greedy_step_calls_few_functions_in_three_files(demo_pair):
    target, drafter = demo_pair
    calls = functions_called_by_the_steps(*demo_pair, list(range(100, 130)), 40)
    listing = "\n".join(f"{path} {name}" for path, name in sorted(calls))
    print(f"{len(calls)} functions:\n{listing}")
    assert {path for path, _ in calls} == STEP_FILES, listing
    assert len(calls) <= MAX_FUNCTIONS, listing


def test_a_whole_greedy_call_calls_few_functions_in_few_files(demo_pair):
    """One whole call on a runner built for it (as generate.py's command builds one), the request's
    checks included: they are cheap at the loop's door; the memory was probed when the caches were
    sized (`check_request`), not again on every call."""
    target, drafter = demo_pair
    prompt, new = list(range(100, 130)), 40
    runner = ModelRunner(target, drafter, max_length=len(prompt) + new + 16)
    calls = project_calls(functools.partial(generate_dflash, target, drafter, prompt, new,
                                            runner=runner))  # a partial: no function of ours
    listing = "\n".join(f"{path} {name}" for path, name in sorted(calls))
    print(f"{len(calls)} functions:\n{listing}")
    assert ("dflash/qwen3.py", "Qwen3.check_request") in calls, listing  # the checks are counted
    assert len({path for path, _ in calls}) <= MAX_CALL_FILES, listing
    assert len(calls) <= MAX_CALL_FUNCTIONS, listing


def test_the_trace_sees_a_function_added_to_the_step(demo_pair, monkeypatch):
    """The count can fail: one more function on the path shows up in it."""
    target, drafter = demo_pair
    before = functions_called_by_the_steps(target, drafter, [5, 6, 7], 8)

    def extra_step_function(logits):
        return logits.max(dim=-1).indices

    monkeypatch.setattr(generate, "argmax", extra_step_function)
    after = functions_called_by_the_steps(target, drafter, [5, 6, 7], 8)
    assert after - before == {("tests/test_runner.py", "test_the_trace_sees_a_function_added_to_the_step."
                                                         "<locals>.extra_step_function")}


def test_a_built_runner_cannot_be_changed_from_outside(demo_pair):
    runner = ModelRunner(*demo_pair, max_length=32)
    with pytest.raises(AttributeError, match="wrap the runner"):
        runner.draft = lambda *args: None
    with pytest.raises(AttributeError, match="wrap the runner"):
        runner.clock = PhaseClock(torch.device("cpu"), ["draft"])
    with pytest.raises(AttributeError):
        del runner.verify


def test_wrappers_time_and_steer_a_runner_without_changing_it(demo_pair):
    """`Timed` counts the passes; `Oracle` drafts the truth: every block is kept whole."""
    target, drafter = demo_pair
    prompt, new = list(range(200, 220)), 33
    runner = ModelRunner(target, drafter, max_length=len(prompt) + new + 32)
    truth = generate_autoregressive(target, prompt, new + 16).new_ids
    clock = PhaseClock(torch.device("cpu"), ["draft", "verify"])
    oracle = Oracle(runner, torch.tensor(prompt + truth))
    result = generate_dflash(target, drafter, prompt, new, runner=Timed(oracle, clock))
    assert result.new_ids == truth[:new]
    assert result.acceptance_lengths == [16, 16]
    assert clock.calls == {"draft": 2, "verify": 2}
    assert "truth" not in vars(runner) and "clock" not in vars(runner)


@pytest.mark.parametrize("queries, keys", [(1, 9), (5, 5), (5, 12), (16, 40)])
def test_every_mask_form_gives_the_boolean_masks_attention(queries, keys):
    """None (every key), a lower-right causal bias and a boolean mask: the same attention where each
    says the same thing, with grouped key/value heads passed as they are."""
    generator = torch.Generator().manual_seed(queries * keys)
    q = torch.randn(1, 4, queries, 16, generator=generator)  # (batch, heads, queries, head_dim)
    k, v = (torch.randn(1, 2, keys, 16, generator=generator) for _ in range(2))  # (b, kv_heads, keys, hd)
    positions = torch.arange(keys - queries, keys)  # the last `queries` of the keys
    reference = masked(causal_mask(positions, keys))(q, k, v)
    torch.testing.assert_close(masked(causal_lower_right(queries, keys))(q, k, v), reference)
    everything = masked(torch.ones(queries, keys, dtype=torch.bool))(q, k, v)
    torch.testing.assert_close(masked(None)(q, k, v), everything)


def test_eager_passes_take_the_fast_mask_forms_and_equal_fixed_shape_reads(demo_pair):
    """The eager loop (no mask, a causal bias) and a fixed-shape read of the whole buffer under a
    boolean mask give the same tokens and the same acceptance."""
    target, drafter = demo_pair
    prompt, new = list(range(300, 341)), 40
    eager = generate_dflash(target, drafter, prompt, new)
    # reads a bucket of slots under a boolean position mask, as compiled passes do
    fixed = ModelRunner(target, drafter, max_length=len(prompt) + new + 16, fixed_shape=True)
    whole = generate_dflash(target, drafter, prompt, new, runner=fixed)
    assert whole.new_ids == eager.new_ids == generate_autoregressive(target, prompt, new).new_ids
    assert whole.acceptance_lengths == eager.acceptance_lengths
