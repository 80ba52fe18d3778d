"""The cache reorder table of benchmarks/decode.py: what reordering the beams' KV cache costs per
decoder step, the old way (the whole cache gathered after every step) against the current one
(only the written self-attention positions, and only at steps where some beam changed parent).
decode.py's module docstring says what each column measures. It lives apart from the runner:
besides two whole searches it builds its own beam cache and jitted loops of `decode_step`, which
nothing else in decode.py needs.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks import _timing
from transformer_mt.data.tokenizer import EOS_ID, PAD_ID
from transformer_mt.decoding import beam_rows
from transformer_mt.decoding import incremental as decode

STEPS_PER_LOOP = 10


def reorder_table(decoder, translator, batch, beam, reps):
  """Per-step cost of reordering the cache, measured inside loops of decoder steps, on `batch`
  (inputs, max_lengths, max_len), as decode.make_batch returns it."""
  t = translator
  inputs, max_lengths, max_len = batch
  rows_per_batch = inputs.shape[0] * beam
  # Each beam swaps with its neighbour, so every row moves (the cost does not depend on which).
  parents = np.tile(np.arange(beam) ^ 1, (inputs.shape[0], 1)).astype(np.int32)
  rows = beam_rows.parent_rows(jnp.asarray(parents))  # [batch * beam]
  tokens = jnp.full((rows_per_batch,), EOS_ID + 3, jnp.int32)
  valid = jnp.repeat(inputs != PAD_ID, beam, axis=0)  # [batch * beam, src_len]
  with jax.set_mesh(t.mesh):
    cache = beam_rows.expand_to_beams(
      decode.init_cache(t.params, inputs, t.model_config, max_len), inputs.shape[0], beam
    )

  def old(cache, position, reorder):  # before: step, then gather the whole cache
    cache = decode.decode_step(t.params, cache, valid, tokens, position, t.model_config)[1]
    return beam_rows.gather_rows(cache, rows)

  def gather_new(cache):
    self_cache, cross_cache = decode.split_cache(cache)
    return decode.merge_cache(decode.gather_written_rows(self_cache, rows), cross_cache)

  def new(cache, position, reorder):  # now: gather written rows if needed, then step
    cache = jax.lax.cond(reorder, gather_new, lambda cache: cache, cache)
    return decode.decode_step(t.params, cache, valid, tokens, position, t.model_config)[1]

  variants = {
    "step": lambda cache, position, reorder: decode.decode_step(
      t.params, cache, valid, tokens, position, t.model_config
    )[1],
    "old": old,
    "new": new,
    "old_copy": lambda cache, position, reorder: beam_rows.gather_rows(cache, rows),
    "new_copy": lambda cache, position, reorder: gather_new(cache),
  }

  def loop(body):
    def run(cache, position, reorder):
      cache = jax.tree.map(lambda x: jnp.full_like(x, position) if x.ndim == 0 else x, cache)
      return jax.lax.fori_loop(
        0, STEPS_PER_LOOP, lambda i, cache: body(cache, position + i, reorder), cache
      )

    return jax.jit(run)

  loops = {name: loop(body) for name, body in variants.items()}
  positions = (8, max_len - STEPS_PER_LOOP)
  cases = [(name, position, name != "skipped") for position in positions for name in variants]
  cases += [("skipped", position, False) for position in positions]
  best = {}
  # Rounds over all cases rather than repetitions of one, so that a burst of load from
  # elsewhere on the machine does not fall on a single variant.
  with jax.set_mesh(t.mesh):
    for round_ in range(reps + 1):
      for name, position, reorder in cases:
        run = loops["new" if name == "skipped" else name]
        args = (cache, jnp.array(position, jnp.int32), jnp.array(reorder))
        seconds = _timing.time_calls(lambda run=run, args=args: run(*args), warmup=0, reps=1).best
        if round_:  # the first round compiles
          best[name, position] = min(
            best.get((name, position), np.inf), 1000 * seconds / STEPS_PER_LOOP
          )

  cache_mb = sum(x.nbytes for x in jax.tree.leaves(cache)) / 1e6
  results = {
    "beam": beam,
    "rows": rows_per_batch,
    "src_len": inputs.shape[1],
    "max_len": max_len,
    "cache_mb": cache_mb,
    "positions": {},
  }
  print(
    f"\nCache reorder: beam {beam}, {rows_per_batch} rows, source bucket {inputs.shape[1]}, "
    f"max_len {max_len}, cache {cache_mb:.0f} MB; ms per decoder step (best of {reps})"
  )
  print(
    f"{'position':>8} {'step':>6} {'old':>6} {'new':>6} {'skipped':>7} {'old-step':>9} "
    f"{'new-step':>9} {'old copy':>9} {'new copy':>9}"
  )
  for position in positions:
    r = {name: best[name, position] for name in list(variants) + ["skipped"]}
    r["old_share"] = (r["old"] - r["step"]) / r["old"]
    r["new_share"] = (r["new"] - r["step"]) / r["new"]
    results["positions"][position] = r
    print(
      f"{position:8d} {r['step']:6.1f} {r['old']:6.1f} {r['new']:6.1f} {r['skipped']:7.1f} "
      f"{r['old'] - r['step']:5.1f} {r['old_share']:3.0%} {r['new'] - r['step']:5.1f} "
      f"{r['new_share']:3.0%} {r['old_copy']:9.1f} {r['new_copy']:9.1f}"
    )

  runs = {}
  for name, always_gather in (("old", True), ("new", False)):
    outputs, timing, _ = decoder(beam, inputs, max_lengths, max_len, always_gather=always_gather)
    runs[name] = {
      "run_s": timing.best,
      "steps": int(outputs.num_steps),
      "reorders": int(outputs.num_reorders),
      "sequences": np.asarray(outputs.sequences),
    }
  same = bool(np.array_equal(runs["old"].pop("sequences"), runs["new"].pop("sequences")))
  results.update(search_old=runs["old"], search_new=runs["new"], same_outputs=same)
  print(
    f"whole search, {runs['new']['steps']} steps: always_gather (old) "
    f"{runs['old']['run_s']:.2f} s, now {runs['new']['run_s']:.2f} s, cache reordered at "
    f"{runs['new']['reorders']} steps; "
    f"outputs {'identical' if same else 'DIFFERENT'}"
  )
  return results
