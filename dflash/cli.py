"""What every program shares. Bad input (an argument, a file, a checkpoint that does not fit) ends a program
with one `error: ...` line and exit status 2; anything else is a bug and keeps its traceback."""

from __future__ import annotations

import argparse
import math
import os
import signal
import sys
from pathlib import Path
from typing import Callable, Sequence

import torch

from dflash.checkpoint import read_json, read_jsonl
from dflash.errors import CheckpointError, TokenizerError, UsageError


class OneLineErrors(argparse.ArgumentParser):
    """argparse, but a bad argument is one `error:` line (no usage dump) and exit status 2."""

    def error(self, message: str):
        print(f"error: {message}", file=sys.stderr)
        raise SystemExit(2)


def run_cli(parser: argparse.ArgumentParser, run: Callable[..., int], argv: Sequence[str] | None = None) -> int:
    """Parse, run, and turn every user error into one `error:` line and exit status 2 (returned, also for what the
    parser refuses, so that a caller in the same process gets the status as a shell would)."""
    try:
        args = parser.parse_args(argv)
    except SystemExit as exit:  # `OneLineErrors.error` (2), or --help (0)
        return exit.code
    threads = vars(args).get("threads", ())  # add_device_options' --threads, or a program's own
    if not isinstance(threads, (list, tuple)):  # a list of counts (cpu_study) is set by its runs
        use_threads(threads)
    try:
        return run(args)
    except (UsageError, CheckpointError, TokenizerError) as err:  # what a user can fix
        print(f"error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # Ctrl-C where a program has no more to say: the shell's 130
        print("error: interrupted (Ctrl-C)", file=sys.stderr)
        return 128 + signal.SIGINT
    except OSError as err:  # the machine refused (a full disk, a folder moved away, no rights)
        print(f"error: {os_error_line(err)}", file=sys.stderr)
        return 2


def os_error_line(err: OSError) -> str:
    """An operating system's refusal as one line naming the file: "path: No space left on device"."""
    where = ", ".join(str(name) for name in (err.filename, err.filename2) if name is not None)
    reason = err.strerror or str(err) or type(err).__name__
    return f"{where}: {reason}" if where else reason


def add_device_options(parser: argparse.ArgumentParser) -> None:
    """`--device`, `--dtype` and `--threads`, meaning the same in every program (`run_cli` applies
    the threads)."""
    parser.add_argument("--device", default="auto", help="auto (cuda if available), cpu, cuda, cuda:1...")
    parser.add_argument("--dtype", choices=["auto", "float32", "bfloat16", "float16"], default="auto",
                        help="auto: bfloat16 on CUDA; on a CPU, bfloat16 for a bfloat16 checkpoint "
                        "where the CPU multiplies bfloat16 (AMX, AVX-512 BF16), else float32")
    parser.add_argument("--threads", type=thread_count, help="CPU threads for torch (default: "
                        "$OMP_NUM_THREADS if set, else the physical cores less one, here "
                        f"{default_threads()}: torch's threads wait on each other, so one core "
                        "taken by another process stalls every step of a run that uses them all)")


def physical_cores() -> int:
    """The cores this process may run on, counting a core's hardware threads once: two threads of
    one core share its arithmetic units."""
    allowed = os.cpu_count() or 1
    if hasattr(os, "sched_getaffinity"):  # Linux: the cores this process may use
        allowed = len(os.sched_getaffinity(0))
    try:
        cpuinfo = Path("/proc/cpuinfo").read_text()
    except OSError:
        return allowed
    cores, package = set(), None
    for line in cpuinfo.splitlines():  # "physical id : 0", then "core id : 3", per hardware thread
        name, _, value = (part.strip() for part in line.partition(":"))
        if name == "physical id":
            package = value
        elif name == "core id":
            cores.add((package, value))
    return max(1, min(allowed, len(cores) or allowed))


def default_threads() -> int:
    """torch's CPU threads unless --threads says: $OMP_NUM_THREADS (as torchrun sets it), else the
    physical cores less one, at least one (see --threads)."""
    from_env = os.environ.get("OMP_NUM_THREADS", "")
    if from_env.isdigit() and int(from_env) > 0:
        return int(from_env)
    return max(1, physical_cores() - 1)


def use_threads(count: int | None) -> None:
    torch.set_num_threads(count or default_threads())


def pick_device(name: str) -> torch.device:
    """`auto` is CUDA when there is one; anything else must exist here, or it is one error line."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError:  # not a device name at all
        device = None
    if device is not None and device.type == "cpu" and device.index in (None, 0):  # cpu:5 is no cpu
        return device
    if device is not None and device.type == "cuda" and torch.cuda.is_available():
        if device.index is None or device.index < torch.cuda.device_count():
            return device
        count = torch.cuda.device_count()
        raise UsageError(f"device {name!r} is not available here: {count} CUDA device(s), "
                         f"cuda:0..cuda:{count - 1}")
    raise UsageError(f"device {name!r} is not available here (use cpu, auto, or cuda where CUDA is)")


def pick_dtype(name: str, device: torch.device, checkpoint: Path | None = None) -> torch.dtype:
    """`auto` is bfloat16 on CUDA (what real checkpoints are stored in). On the CPU it is bfloat16
    where the checkpoint is stored in bfloat16 (official Qwen3) and the CPU multiplies bfloat16
    itself (AMX or AVX-512 BF16: a 16-token verify then costs little more than a decode,
    benchmarks/cpu_study.py), float32 otherwise (a CPU without them converts every product)."""
    if name != "auto":
        return getattr(torch, name)
    if device.type == "cuda":
        return torch.bfloat16
    return torch.bfloat16 if stored_in_bfloat16(checkpoint) and cpu_multiplies_bfloat16() \
        else torch.float32


def stored_in_bfloat16(checkpoint: Path | None) -> bool:
    """Whether a checkpoint folder's config.json says its weights are bfloat16 (`dtype`, or the
    older `torch_dtype`); a config that cannot be read says nothing (its loader will say why)."""
    try:  # through the checked reader: a FIFO as config.json would wait here for ever
        config = read_json(Path(checkpoint) / "config.json")
    except (CheckpointError, TypeError):
        return False
    return isinstance(config, dict) and "bfloat16" in (config.get("dtype"), config.get("torch_dtype"))


def cpu_multiplies_bfloat16() -> bool:
    """AMX tiles or AVX-512 BF16 dot products, as torch's CPU kernels detect them."""
    probes = ("_is_amx_tile_supported", "_is_avx512_bf16_supported")  # torch 2.3 and later
    return any(getattr(torch.cpu, probe, lambda: False)() for probe in probes)


def checked(kind: type, rule: str, ok: Callable) -> Callable[[str], object]:
    """An argparse type refusing, in one `error:` line, a value that would only fail (or train nonsense) later."""
    def parse(text: str):
        if not ok(value := kind(text)):
            raise argparse.ArgumentTypeError(f"must be {rule}, got {text}")
        return value

    parse.__name__ = kind.__name__  # as argparse names it: "invalid int value"
    return parse


positive_int = checked(int, "positive", lambda x: x > 0)
seed = checked(int, "an integer in 0..2**64 - 1 (what torch's generators take)",
               lambda x: 0 <= x < 2**64)
CORES = os.cpu_count() or 1
thread_count = checked(int, f"an integer in 1..{CORES} (the cores here: more wait on each other)",
                       lambda x: 1 <= x <= CORES)
positive = checked(float, "a finite number above 0", lambda x: 0 < x < math.inf)  # nan fails every comparison
non_negative = checked(float, "a finite number >= 0", lambda x: 0 <= x < math.inf)  # a temperature, say


class HelpWithDefaults(argparse.RawDescriptionHelpFormatter):
    """--help shows each option's default where it has a value, and the epilog as written."""

    def _get_help_string(self, action):
        unset = any(action.default is none for none in (None, False, argparse.SUPPRESS)) or "(default:" in action.help
        return action.help + ("" if unset else " (default: %(default)s)")


def int_list(text: str) -> list[int]:
    """An option's `1,9,17` as [1, 9, 17] (argparse `type=`, so a bad value is argparse's one-line error);
    an empty piece (`1,,3`) is a typo, not a number to skip."""
    try:
        return [int(piece) for piece in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None


def check_output(path: Path, option: str, folder: bool = False) -> None:
    """Refuse, before any work, an output the program could only fail to write at the end: a file where a folder goes
    or the reverse, or a place under a file or not writable. Missing folders are fine: the writer makes them."""
    path = Path(path).absolute()
    if path.exists() and path.is_dir() != folder:
        raise UsageError(f"{option} {path}: {'not a folder' if folder else 'is a folder, not a file'}")
    existing = next(parent for parent in path.parents if parent.exists())  # the root always does
    if not existing.is_dir():
        raise UsageError(f"{option} {path}: {existing} is a file, not a folder")
    if not os.access(existing, os.W_OK):
        raise UsageError(f"{option} {path}: cannot write in {existing}")


def refuse_overlap(outputs: dict[str, object], inputs: dict[str, object]) -> None:
    """Refuse, before any work, an output (option name: path, or None) that is, holds or lies
    inside an input or another output (a prompts file, a checkpoint folder): writing it would
    overwrite or delete what the program reads. Compared as the operating system sees them
    (resolved: links and `..` followed), never as strings, so `runs/a2` is not inside `runs/a`."""
    named = {**inputs, **outputs}
    for option, output in outputs.items():
        if output is None:
            continue
        mine = Path(output).resolve()
        for other, given in named.items():
            if given is None or other == option:
                continue
            theirs = Path(given).resolve()
            relation = "is" if mine == theirs else "holds" if theirs.is_relative_to(mine) \
                else "lies inside" if mine.is_relative_to(theirs) else None
            if relation:
                raise UsageError(f"{option} {output} {relation} {other} {given}: an output must "
                                 f"lie apart from the program's inputs and other outputs")


def check_token_ids(ids: Sequence[int], vocab_size: int, where: str) -> None:
    """Refuse ids the model has no embedding for, naming the first one."""
    outside = [token for token in ids if not 0 <= token < vocab_size]
    if outside:
        raise UsageError(f"{where}: token id {outside[0]} is outside the vocabulary (0..{vocab_size - 1})")


def jsonl_records(path: Path, what: str, whole_lines_only: bool = False) -> list[tuple[str, object]]:
    """("file:line", parsed JSON) for every non-blank line of a file the user names (see
    `checkpoint.read_jsonl`); what is wrong with it is a UsageError."""
    return read_jsonl(path, what, UsageError, whole_lines_only)
