"""Sentence pairs and tokenizers: sources, text files, TFDS, the Grain input pipeline."""
