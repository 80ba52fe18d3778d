"""Where a sweep's Optuna study lives: a journal file in the sweep root by default, or the
storage `--storage` names (an SQLAlchemy URL of a database server, or a journal path).

Optuna's documentation says which storage fits where, and users report what happens
otherwise:
  * one host, no server: a journal file (Optuna's JournalFileBackend), ROOT/study.journal;
  * a cluster: a database server (PostgreSQL, MySQL), which every worker reaches;
  * SQLite on a network filesystem: corrupted by its broken locking there (optuna/optuna#815),
    so it is refused;
  * a journal file on a network filesystem: writes can be lost on NFS under SLURM
    (optuna/optuna#5138), so it is allowed with a warning that names the issue.
A storage that cannot be opened (no server, wrong credentials, a driver not installed, a URL
SQLAlchemy cannot parse) is one line naming the URL, password hidden, and what to check.
"""

from __future__ import annotations

import logging
import os

from transformer_mt.runtime import errors
from transformer_mt.workdir import filesystems

DEFAULT_JOURNAL = "study.journal"
# A server that does not answer fails the sweep at once rather than after the OS's timeout.
CONNECT_TIMEOUT_S = 10


def shown(spec: str) -> str:
  """The storage as printed and recorded: a URL's password hidden."""
  if "://" not in spec:
    return spec
  try:
    from sqlalchemy.engine import make_url

    return make_url(spec).render_as_string(hide_password=True)
  except Exception:  # noqa: BLE001 - an unparsable URL is shown as given, minus nothing
    return spec


def journal_path(spec: str | None, root: str) -> str | None:
  """The journal file a storage spec names (the default one in ROOT when None), or None for
  a database URL."""
  if not spec:
    return os.path.join(root, DEFAULT_JOURNAL)
  return None if "://" in spec else spec


def open_storage(spec: str | None, root: str):
  """The Optuna storage of a sweep in ROOT: `spec` as `--storage` gives it, or None for the
  journal file ROOT/study.journal.

  Raises:
    errors.BadValue: one line: SQLite on a network filesystem, or a storage that cannot be
      opened (the URL, password hidden, and what to check).
  """
  import optuna

  path = journal_path(spec, root)
  if path is not None:
    return _journal(path)
  if spec.startswith("sqlite"):
    database = spec.split(":///", 1)[-1]
    fs_type = filesystems.filesystem_type(database or ".")
    if filesystems.is_network(fs_type):
      raise errors.BadValue(
        f"--storage {spec}: SQLite on a network filesystem ({fs_type}) corrupts under parallel "
        "workers (optuna/optuna#815). Use a database server (postgresql://...) for a cluster, "
        "or leave --storage out for a journal file in the sweep root on one host."
      )
  engine_kwargs = {}
  if spec.startswith(("postgresql", "mysql")):
    engine_kwargs = {"connect_args": {"connect_timeout": CONNECT_TIMEOUT_S}}
  try:
    return optuna.storages.RDBStorage(spec, engine_kwargs=engine_kwargs)
  except ImportError as e:
    raise errors.BadValue(
      f"--storage {shown(spec)}: its database driver is not installed ({e}); install it "
      "(e.g. pip install psycopg2-binary for postgresql://, pymysql for mysql+pymysql://)."
    ) from e
  except Exception as e:
    if not _is_database_error(e):
      raise
    reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    raise errors.BadValue(
      f"--storage {shown(spec)} cannot be opened: {reason}. Check that the URL is an "
      "SQLAlchemy one (dialect+driver://user:password@host:port/database), that the server "
      "runs and this host reaches it, and that the user and database exist."
    ) from e


def _is_database_error(error: Exception) -> bool:
  """SQLAlchemy's errors (a bad URL, a refused connection) and the driver's, which are user
  errors here; anything else is a bug and stays a traceback."""
  import sqlalchemy.exc

  return isinstance(error, (sqlalchemy.exc.SQLAlchemyError, ValueError)) or type(
    error
  ).__module__.split(".")[0] in ("psycopg2", "psycopg", "pymysql", "MySQLdb")


def _journal(path: str):
  import optuna

  fs_type = filesystems.filesystem_type(os.path.dirname(os.path.abspath(path)))
  if filesystems.is_network(fs_type):
    logging.warning(
      "The study's journal file %s is on a network filesystem (%s), where Optuna's journal can "
      "lose writes under concurrent workers (optuna/optuna#5138). For workers on several "
      "hosts, use --storage postgresql://... (docs/sweeps.md).",
      path,
      fs_type,
    )
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  try:
    backend = optuna.storages.journal.JournalFileBackend(path)
  except OSError as e:
    raise errors.BadValue(f"--storage {path}: cannot open the journal file: {e}.") from e
  return optuna.storages.JournalStorage(backend)
