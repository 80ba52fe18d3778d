"""A failed Orbax read waits for its other reads before Orbax closes its event loop.

Orbax runs each of its synchronous calls (a restore, a metadata read) as one coroutine on a
fresh event loop (`orbax.checkpoint._src.asyncio_utils.run_sync`, 0.12.8) and closes that loop
as soon as the coroutine returns or raises. A read of a checkpoint with missing or truncated
files fails in one array first: `asyncio.gather` raises that error at once, and Orbax closes the
loop while the other arrays' tensorstore reads are still in flight. Each of those then completes
into the closed loop ("RuntimeError: Event loop is closed", a traceback tensorstore's callback
prints on stderr), or ends with an error nobody retrieves ("Task exception was never retrieved"
once it is garbage-collected). Orbax has no hook for its loops, so inside
`remaining_tasks_awaited()` the coroutine it is given is wrapped: when it raises, it first waits,
on its own loop, until every other task of that loop is done (as Orbax's `AsyncRunner.shutdown`
does), then raises the same error. A call that succeeds runs as before.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Coroutine, Iterator
from typing import Any

from orbax.checkpoint._src import asyncio_utils

_orbax_run_sync = asyncio_utils.run_sync
_lock = threading.Lock()
_depth = 0  # the contexts open in this process, across threads


async def _awaiting_the_rest_on_error(coro: Coroutine[Any, Any, Any]) -> Any:
  try:
    return await coro
  except Exception:
    this = asyncio.current_task()
    while rest := [task for task in asyncio.all_tasks() if task is not this]:
      # return_exceptions: each error is retrieved here; the first one is raised below.
      await asyncio.gather(*rest, return_exceptions=True)
    raise


def _run_sync(coro: Coroutine[Any, Any, Any]) -> Any:
  return _orbax_run_sync(_awaiting_the_rest_on_error(coro))


@contextlib.contextmanager
def remaining_tasks_awaited() -> Iterator[None]:
  """Orbax's synchronous calls made inside wait for their remaining tasks when they fail."""
  global _depth
  with _lock:
    _depth += 1
    asyncio_utils.run_sync = _run_sync
  try:
    yield
  finally:
    with _lock:
      _depth -= 1
      if not _depth:
        asyncio_utils.run_sync = _orbax_run_sync
