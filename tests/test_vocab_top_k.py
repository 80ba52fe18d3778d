"""The blocked top-k of beam search's per-beam ranking against jax.lax.top_k itself."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from transformer_mt.decoding import vocab_top_k


def rows_with_ties(rng, shape, specials: bool) -> np.ndarray:
  """float32 rows of few distinct values (ties everywhere: the same maximum in many blocks),
  with -inf entries (masked ids) and, when `specials`, some NaN and +inf."""
  x = rng.integers(-3, 4, size=shape).astype(np.float32)
  x[rng.random(shape) < 0.05] = -np.inf
  if specials:
    x[rng.random(shape) < 0.001] = np.nan
    x[rng.random(shape) < 0.001] = np.inf
  return x


@pytest.mark.parametrize("n", [1024, 1500, 9712])
@pytest.mark.parametrize("k", [1, 4, 8])
@pytest.mark.parametrize("specials", [False, True])
def test_blocked_top_k_is_lax_top_k(n, k, specials):
  """The same values and indices as jax.lax.top_k, on rows whose length is or is not a multiple
  of the block, with many ties (the lower index must win), -inf, NaN and +inf entries; and on
  continuous values, where every block's maximum differs."""
  rng = np.random.default_rng(n * 10 + k)
  for x in (
    rows_with_ties(rng, (3, 4, n), specials),
    rng.standard_normal((3, 4, n)).astype(np.float32),
  ):
    values, indices = jax.jit(vocab_top_k.top_k, static_argnums=1)(jnp.asarray(x), k)
    expected_values, expected_indices = jax.lax.top_k(jnp.asarray(x), k)
    np.testing.assert_array_equal(np.asarray(indices), np.asarray(expected_indices))
    np.testing.assert_array_equal(np.asarray(values), np.asarray(expected_values))
    assert indices.dtype == jnp.int32


def test_rows_built_to_trap_the_two_stages():
  """All k best entries in one block (the first stage must keep that block, the second pick
  inside it), or a tie between a block ranked second and one ranked first (the entry of the
  lower index must win although its block ranks lower)."""
  x = np.full((3, 2048), -1.0, np.float32)
  x[0, 100:104] = [5.0, 7.0, 6.0, 7.0]
  x[1, 2040:2048] = np.arange(8, dtype=np.float32)
  x[2, 0], x[2, 16:18] = 2.0, [3.0, 2.0]  # block 0's best is 2; block 1 holds 3 and 2
  values, indices = vocab_top_k.top_k(jnp.asarray(x), 4)
  expected = [[101, 103, 102, 100], [2047, 2046, 2045, 2044], [16, 0, 17, 1]]
  np.testing.assert_array_equal(np.asarray(indices), expected)
  np.testing.assert_array_equal(np.asarray(values), [[7, 7, 6, 5], [7, 6, 5, 4], [3, 2, 2, -1]])
