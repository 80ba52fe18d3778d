"""What the benchmark scripts share, written once (not scripts themselves):

timing            wall and CPU time of jitted calls, the matmul peak, the machine's line
steps             model shapes, batches, the useful-FLOP count, TrainStepBench (our step)
models            random models to decode, and our beam search against transformers' generate
linen_reference   train_step.py's reference: a plain Flax Linen encoder-decoder
packed_attention  accelerator.py's "packed" section
xla_gpu_flags     accelerator.py's "xla_flags" section (a process per variant)
corpus            generated news-like EN-DE corpora of any size
tfds_corpus       such a corpus written as a prepared TFDS dataset
process_memory    RSS of a process tree, sampled from /proc
"""
