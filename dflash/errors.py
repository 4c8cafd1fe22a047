"""The errors a program turns into one `error: ...` line and exit status 2 (`dflash.cli.run_cli`).

They live here, below every module that raises them: the sampling math, the checkpoint reader and
the tokenizer each refuse bad input without importing the command line. Anything else raised is a
bug and keeps its traceback."""


class UsageError(ValueError):
    """Bad input: a request, a command line or a file it names. The message is one line."""


class CheckpointError(ValueError):
    """A checkpoint this code cannot load. The message is one line a CLI can print."""


class TokenizerError(ValueError):
    """A tokenizer, or a conversation, this code cannot handle. The message is one line a CLI can
    print."""
