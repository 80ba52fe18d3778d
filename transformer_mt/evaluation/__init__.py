"""BLEU and chrF, test-set evaluation, plots."""
