"""The errors transformer_mt raises on purpose, for bad input (a flag, a config value, a file).

`cli.main` prints such an error as one `error: ...` line and exits with status 2: the message
says what is wrong, where, and what to do, and a traceback would only hide it. Every other
exception (a plain ValueError or KeyError from JAX, Orbax, NumPy or our own code) is a bug,
or a fault of the machine: `cli.main` prints its traceback and exits with status 1, so that it
is never mistaken for a user's mistake.

Each class also derives from the built-in type it replaces (ValueError, FileNotFoundError...),
so callers and tests that catch the built-in type keep working.
"""

from __future__ import annotations

from collections.abc import Iterator


class UserError(Exception):
  """Raised on purpose with a message that is all the user needs (one line, exit status 2):
  bad input, or a state of their run they must act on (a diverged or stopped run)."""


class BadValue(UserError, ValueError):
  """A flag, config value, override or file content that cannot be used."""


class MissingFile(UserError, FileNotFoundError):
  """A file or directory the user named (or the command needs) does not exist."""


class AlreadyExists(UserError, FileExistsError):
  """The command would overwrite something it must not (e.g. checkpoints)."""


class UnknownName(UserError, KeyError):
  """A name (a language, a key) the user's data or flags ask for that is not there."""

  def __str__(self) -> str:
    # KeyError's own str() is the repr of its argument, quotes included.
    return str(self.args[0]) if self.args else ""


class Stopped(UserError, RuntimeError):
  """The run was stopped before it finished (e.g. by SIGTERM); rerunning it resumes."""


def cause_chain(error: BaseException | None) -> Iterator[BaseException]:
  """`error`, then what it was raised from or while handling, and so on: libraries (Orbax,
  tensorstore) wrap the exception that says what went wrong, so callers sorting a failure
  look down this chain."""
  while error is not None:
    yield error
    error = error.__cause__ or error.__context__
