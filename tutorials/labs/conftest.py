"""The labs' switch and shared fixtures.

- `lab`: the module a grader grades, loaded by path from the grader's own folder: `starter.py`
  (what the student edits), or the reference answer beside it when DFLASH_LABS=solutions.
- `demo`: the demo pair, one per session, loaded on first use.
- A starter function that still raises NotImplementedError fails its lab with one line naming
  the file to edit, and a failed check with its message alone, not a traceback (`--tb=long` shows it).
- The graded module is read before it runs (what no lab allows: `_lab_helpers.load_submission`), and
  a grader fails if, by its end, the module changed torch, the project or the grader.
- A grader that runs longer than DFLASH_LABS_TIMEOUT seconds (120 by default) fails in one line:
  a loop that never ends costs its lab, not the run.
- `-k NAME`, where NAME is a lab's name exactly (`-k rope`), selects that lab alone, not every lab
  whose name contains it (`interleaved_rope`).
"""

import contextlib
import os
import signal
from pathlib import Path

import pytest
import torch
from _lab_helpers import (LABS, ROOT, DemoPair, RuleBroken, Untouched,  # this folder: on the path
                          graded_kind, load_submission, short_name)

TIMEOUT = 120  # seconds a grader may run: the slowest solution takes about 10


def pytest_configure(config):
    torch.set_num_threads(1)  # tiny models: one thread is as fast, and far steadier on a busy machine


@pytest.fixture(scope="session")
def demo() -> DemoPair:
    return DemoPair()


@pytest.fixture
def lab(request):
    """The graded module of the requesting grader's lab, read and imported by `load_submission`; the
    snapshot it is checked against at the grader's end is taken here, before it runs."""
    folder = request.path.parent
    path = folder / f"{graded_kind()}.py"
    request.node.untouched = Untouched()
    try:
        with time_limit():  # a submission's code runs at import too
            return load_submission(path, f"lab_{folder.name}_{path.stem}", folder.name)
    except RuleBroken as error:
        message = str(error)
    except TimedOut:
        message = out_of_time_message(folder.name)
    pytest.fail(message, pytrace=False)


class TimedOut(BaseException):
    """A grader ran past its time: a BaseException, so that no `except Exception` in a submission
    takes it."""


def seconds_allowed() -> int:
    return int(os.environ.get("DFLASH_LABS_TIMEOUT") or TIMEOUT)


def out_of_time(signum, frame):
    raise TimedOut


def out_of_time_message(lab: str) -> str:
    return (f"{lab}: stopped after {seconds_allowed()} s (a loop that never ends? "
            "DFLASH_LABS_TIMEOUT sets the limit)")


@contextlib.contextmanager
def time_limit():
    """TimedOut is raised in the block once it has run `seconds_allowed()` seconds (where there is
    an alarm signal: not on Windows, where the block runs unlimited)."""
    if not hasattr(signal, "SIGALRM"):
        yield
        return
    before = signal.signal(signal.SIGALRM, out_of_time)
    signal.alarm(seconds_allowed())
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, before)


def unwritten_function(error: BaseException):
    """(file, function name) where a NotImplementedError was raised, if that is a lab's starter or solution."""
    traceback = error.__traceback__
    while traceback.tb_next is not None:
        traceback = traceback.tb_next
    code = traceback.tb_frame.f_code
    path = Path(code.co_filename).resolve()
    if path.parent.parent == LABS and path.stem in ("starter", "solution"):
        return path, code.co_qualname
    return None


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    """A grader's verdict as the student should read it: one line, not a traceback through the grader (run with
    --tb=long to see that). An unwritten starter function names the file to edit; a failed check keeps its
    message and drops pytest's introspection of the comparison."""
    try:
        with time_limit():
            result = yield
        if hasattr(item, "untouched"):
            item.untouched.check(item.path.parent.name)
        return result
    except TimedOut:
        message = out_of_time_message(item.path.parent.name)
    except NotImplementedError as error:
        where = unwritten_function(error)
        if where is None:
            raise
        path, function = where
        message = f"{path.parent.name}: {function} is not written yet - edit {path.relative_to(ROOT).as_posix()}"
    except AssertionError as error:
        message = str(error).split("\nassert ")[0]
        if item.config.option.tbstyle != "auto" or not message.startswith(item.path.parent.name):
            raise  # asked for the whole story, or a failure that is not a grader's verdict
    pytest.fail(message, pytrace=False)  # outside the except clauses: without the exception it replaces


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config, items):
    wanted = (config.option.keyword or "").strip()
    in_labs = [item for item in items if item.path.parent.parent == LABS]
    if wanted not in {short_name(item.path.parent) for item in in_labs}:
        return
    others = [item for item in in_labs if short_name(item.path.parent) != wanted]  # e.g. interleaved_rope for rope
    if others:
        config.hook.pytest_deselected(items=others)
        items[:] = [item for item in items if item not in others]


@pytest.hookimpl(tryfirst=True)  # before pytest's header is printed
def pytest_sessionstart(session):
    """One seed for the whole run, drawn unless DFLASH_LABS_SEED is set, and put there: every
    grader draws from it, and pytest's header prints it, so that the run can be replayed."""
    import os

    from _lab_helpers import drawn_seed
    if not os.environ.get("DFLASH_LABS_SEED"):
        os.environ["DFLASH_LABS_SEED"] = str(drawn_seed())
        session.config.add_cleanup(lambda: os.environ.pop("DFLASH_LABS_SEED", None))


def pytest_report_header(config):
    """The run's seed, atop pytest's report."""
    import os
    seed = os.environ["DFLASH_LABS_SEED"]
    return f"labs seed: {seed} (DFLASH_LABS_SEED={seed} replays it)"
