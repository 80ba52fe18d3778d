"""The mutants of the data stage and of what a run leaves on disk or meets as a fault: the input
pipeline, prepared corpora and their cache folder, the tokenizer cache, the TFDS range read,
the data fingerprint a resume checks, the writer lock and preemption. tests/mutants.py runs
them after tests/mutant_list.py's `MUTANTS`, under the same rules (each `original` occurs
once in its file, indentation included).
"""

from __future__ import annotations

from mutant_list import Mutant

IO_MUTANTS = (
  Mutant(
    "validation-drops-last-batch",
    "validation batches (input_pipeline.evaluation_batches) drop the last partial batch",
    "transformer_mt/data/input_pipeline.py",
    "  for start in range(0, len(examples), batch_rows):",
    "  for start in range(0, len(examples) - batch_rows + 1, batch_rows):",
    (
      "tests/test_input_pipeline.py::test_evaluation_batches_keep_every_pair",
      "tests/test_mutant_guards.py::test_evaluation_batches_keep_a_partial_last_batch",
    ),
  ),
  Mutant(
    "corpus-change-not-seen",
    "a resume over changed training data goes on silently (the fingerprint is not compared)",
    "transformer_mt/data/corpus_fingerprint.py",
    "  if not changes:",
    "  if True:",
    ("tests/test_changed_corpus.py::test_resuming_over_a_changed_file_stops_with_one_line",),
  ),
  Mutant(
    "corpus-change-as-restore-failure",
    "resume reports changed data as a checkpoint it cannot restore",
    "transformer_mt/training/resume.py",
    "      if changed is not None:  # the checkpoint is whole; the data are not what it was on",
    "      if False:",
    ("tests/test_changed_corpus.py::test_resuming_over_a_changed_file_stops_with_one_line",),
  ),
  Mutant(
    "prepared-index-keyed-by-size-and-mtime",
    "the prepared index is keyed by size and mtime only, so a `cp -p` copy reuses a stale one",
    "transformer_mt/data/line_index_cache.py",
    "  return stat.st_size, stat.st_mtime_ns, stat.st_ino, stat.st_ctime_ns",
    "  return stat.st_size, stat.st_mtime_ns, 0, 0",
    ("tests/test_changed_corpus.py::test_a_copy_keeping_size_and_mtime_is_prepared_again",),
  ),
  Mutant(
    "corpus-fingerprint-compares-paths",
    "a resume over the same text at another path (data staged on a node's disk) is refused",
    "transformer_mt/data/corpus_fingerprint.py",
    "    elif saved[k][1] != current[k][1]:",
    "    elif saved[k] != current[k]:",
    ("tests/test_changed_corpus.py::test_differences_name_each_kind_of_change",),
  ),
  Mutant(
    "content-digest-of-the-first-bytes",
    "a prepared file's digest covers its first bytes only, so an edit further on is not seen",
    "transformer_mt/data/line_offsets.py",
    "      digest.update(block)",
    "      pass",
    (
      "tests/test_prepared_corpus.py::test_reads_exactly_what_read_corpus_reads",
      "tests/test_changed_corpus.py::test_resuming_over_a_changed_file_stops_with_one_line",
    ),
  ),
  Mutant(
    "prepared-files-all-open",
    "a prepared corpus keeps every file pair open (past the open-file limit with many shards)",
    "transformer_mt/data/prepared_corpus.py",
    "    while len(self._opened) >= self._open_limit:",
    "    while False:",
    (
      "tests/test_cluster_preparation.py::"
      "test_five_hundred_shards_read_within_an_open_file_limit_of_256",
    ),
  ),
  Mutant(
    "stale-temporary-of-any-host",
    "preparation removes another host's temporary folder that has this process's PID",
    "transformer_mt/data/cache_writes.py",
    "      len(owner) == 3 and owner[0] == _host() and owner[1].isdigit() and not _alive(owner[1])",
    "      len(owner) == 3 and owner[1].isdigit() and owner[1] == str(os.getpid())",
    (
      "tests/test_cluster_preparation.py::"
      "test_only_this_hosts_dead_or_day_old_temporary_folders_are_removed",
    ),
  ),
  Mutant(
    "preparation-removes-other-versions",
    "preparing a file removes the indexes of the other versions of its path (issue 41), such as"
    " another host's copy at the same local path that its job is reading",
    "transformer_mt/data/line_index_cache.py",
    '    cache_writes.remove_dead_temporaries(folder, f"{_TMP}{group}-")',
    "    [shutil.rmtree(os.path.join(folder, _index_name(_read_json(r.path)['sha256'])), True)"
    " for r in os.scandir(folder) if r.name.startswith(group + '-') and r.name.endswith('.json')]",
    (
      "tests/test_cluster_preparation.py::"
      "test_hosts_with_their_own_copies_at_one_path_prepare_and_read_at_once",
      "tests/test_prepared_corpus.py::test_a_changed_file_is_prepared_again_an_unchanged_one_never",
    ),
  ),
  Mutant(
    "every-process-prepares",
    "every process of a job prepares the local corpus before the barrier, not process 0 alone",
    "transformer_mt/data/sources.py",
    "    if distributed.is_primary():",
    "    if True:",
    ("tests/test_cluster_preparation.py::test_process_0_prepares_while_the_others_wait",),
  ),
  Mutant(
    "tokenizer-cache-key-without-files",
    "the cached tokenizer's key ignores the corpus files, so a changed corpus reuses it",
    "transformer_mt/data/tokenizer_cache.py",
    '    "files": [sha256 for _, sha256 in corpus.content_key()],',
    '    "files": [],',
    ("tests/test_tokenizer_cache.py::test_a_changed_setting_or_corpus_file_trains_a_new_one",),
  ),
  Mutant(
    "array-record-list-read",
    "the TFDS source reads one record with read([i]), whose cost grows with the shard",
    "transformer_mt/data/array_record_reads.py",
    "    (raw,) = reader.read(position, position + 1)",
    "    (raw,) = reader.read([position])",
    ("tests/test_tfds_source.py::test_single_reads_are_range_reads_equal_to_tfds_own",),
  ),
  Mutant(
    "lock-replaces-sigterm-when-unknown",
    "the writer lock replaces SIGTERM's handler when sigaction fails",
    "transformer_mt/workdir/lock.py",
    "    if ctypes.CDLL(None).sigaction(signum, None, current) != 0:",
    "    if False:",
    ("tests/test_workdir_lock.py::test_when_sigaction_cannot_be_asked_sigterm_is_left_alone",),
  ),
  Mutant(
    "preemption-signal-ignored",
    "a SIGTERM during training is recorded under no name and never stops the run",
    "transformer_mt/training/preemption.py",
    "    self.received, self.name = True, signal.Signals(signum).name",
    "    self.name = signal.Signals(signum).name",
    ("tests/test_fault_tolerance.py::test_sigkill_then_sigterm_then_resume_is_bit_identical",),
  ),
  Mutant(
    "signal-save-kept-as-regular",
    "a checkpoint saved off the grid (a signal's stop, a last step) is kept as a regular one",
    "transformer_mt/training/actions.py",
    "      resume_point_only=step.last and not regular,",
    "      resume_point_only=False,",
    (
      "tests/test_actions.py::test_a_save_off_the_grid_is_marked_a_resume_point",
      "tests/test_fault_tolerance.py::"
      "test_a_stop_off_the_checkpoint_grid_leaves_what_an_uninterrupted_run_keeps",
    ),
  ),
  Mutant(
    "resume-points-counted-as-kept",
    "the preservation policy counts resume points toward train.keep_checkpoints",
    "transformer_mt/workdir/retention.py",
    "    regular = [info.step for info in checkpoints if not self._marks[info.step]]",
    "    regular = [info.step for info in checkpoints]",
    (
      "tests/test_actions.py::test_resume_points_never_count_toward_the_checkpoints_kept",
      "tests/test_fault_tolerance.py::"
      "test_a_stop_off_the_checkpoint_grid_leaves_what_an_uninterrupted_run_keeps",
    ),
  ),
  Mutant(
    "average-takes-resume-points",
    "averaging takes the last N checkpoints, resume points included",
    "transformer_mt/workdir/retention.py",
    "  return [step for step in sorted(manager.all_steps()) if not is_resume_point(manager, step)]",
    "  return sorted(manager.all_steps())",
    (
      "tests/test_averaging.py::test_average_skips_resume_points",
      "tests/test_averaging.py::test_train_then_evaluate_its_final_model_prints_the_same_bleu",
    ),
  ),
  Mutant(
    "orbax-loop-closed-with-reads-running",
    "a failed Orbax read no longer waits for its other reads before Orbax closes its loop",
    "transformer_mt/workdir/orbax_loops.py",
    "    asyncio_utils.run_sync = _run_sync",
    "    pass",
    (
      "tests/test_damaged_checkpoint.py::"
      "test_a_failed_read_waits_for_its_other_reads_before_orbax_closes_its_loop",
    ),
  ),
  Mutant(
    "replica-parallel-saving-on-cpu",
    "checkpoints of replicated arrays compile a slice per device on the CPU (Orbax's default)",
    "transformer_mt/workdir/replica_writes.py",
    '  replica_parallel = jax.default_backend() == "tpu"',
    "  replica_parallel = True",
    ("tests/test_fixed_costs.py::test_replicated_arrays_are_saved_without_a_slice_per_device",),
  ),
  Mutant(
    "metric-writer-imports-torch",
    "the metric writer imports tensorboardX with torch (1-2 s of every training start)",
    "transformer_mt/workdir/metrics_log.py",
    '  if "torch" in sys.modules or "tensorboardX" in sys.modules:',
    "  if True:",
    ("tests/test_fixed_costs.py::test_the_metric_writer_leaves_torch_unloaded_and_importable",),
  ),
)
