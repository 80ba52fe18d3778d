"""From parameters to text: incremental decoding, beam search, sampling, the Translator."""
