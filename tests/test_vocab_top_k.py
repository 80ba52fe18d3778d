"""The blocked top-k of beam search's per-beam ranking against jax.lax.top_k itself."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from transformer_mt.decoding import vocab_top_k

# NaN with the sign bit clear (numpy's np.nan) and set (x86's inf - inf), and one of each with
# another payload: lax.top_k ranks them by their bits (0x7fc00001 above 0x7fc00000, 0xffc00001
# below 0xffc00000).
POSITIVE_NAN, NEGATIVE_NAN = np.array([0x7FC00000, 0xFFC00000], np.uint32).view(np.float32)
OTHER_POSITIVE_NAN, OTHER_NEGATIVE_NAN = np.array([0x7FC00001, 0xFFC00001], np.uint32).view(
  np.float32
)


def rows_with_ties(rng, shape, specials: bool) -> np.ndarray:
  """float32 rows of few distinct values (ties everywhere: the same maximum in many blocks),
  with -inf entries (masked ids) and, when `specials`, some +inf, -0.0 and NaN of either
  sign."""
  x = rng.integers(-3, 4, size=shape).astype(np.float32)
  x[rng.random(shape) < 0.05] = -np.inf
  if specials:
    for value in (POSITIVE_NAN, NEGATIVE_NAN, np.inf, -0.0):
      x[rng.random(shape) < 0.001] = value
  return x


def assert_same_bits(values, expected) -> None:
  """Equal float32 arrays bit for bit: NaN's sign and payload, and the sign of zeros, count."""
  np.testing.assert_array_equal(
    np.asarray(values).view(np.uint32), np.asarray(expected).view(np.uint32)
  )


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
    assert_same_bits(values, expected_values)
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


def test_nan_of_either_sign_and_signed_zeros_rank_as_in_lax_top_k():
  """lax.top_k orders floats by their bits (IEEE total order): NaN with the sign bit set below
  -inf, NaN payloads apart, -0.0 below +0.0. Rows built so that a block whose maximum is taken
  the float way (NaN first, whatever its sign; NaN payloads equal; a padding of -inf above a
  negative NaN) would be ranked wrongly; each row checked against lax.top_k and by hand."""
  x = np.full((5, 1030), -1.0, np.float32)
  x[0, 5], x[0, 100] = NEGATIVE_NAN, 0.0  # a block with x86's NaN and nothing large
  x[1, 3], x[1, 40] = POSITIVE_NAN, OTHER_POSITIVE_NAN  # two NaN blocks, the later one first
  x[2, 2], x[2, 50] = -0.0, 0.0
  x[3, :] = NEGATIVE_NAN  # the padding after 1030 must rank below every entry
  x[3, 1029] = OTHER_NEGATIVE_NAN
  x[4, 7], x[4, 20], x[4, 900] = np.inf, POSITIVE_NAN, -np.inf
  x[4, :] = np.where(np.arange(1030) >= 1000, NEGATIVE_NAN, x[4])
  values, indices = jax.jit(vocab_top_k.top_k, static_argnums=1)(jnp.asarray(x), 4)
  expected_values, expected_indices = jax.lax.top_k(jnp.asarray(x), 4)
  np.testing.assert_array_equal(np.asarray(indices), np.asarray(expected_indices))
  assert_same_bits(values, expected_values)
  by_hand = [[100, 0, 1, 2], [40, 3, 0, 1], [50, 2, 0, 1], [0, 1, 2, 3], [20, 7, 0, 1]]
  np.testing.assert_array_equal(np.asarray(indices), by_hand)
