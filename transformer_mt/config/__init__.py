"""Experiment configs: the defaults of every key, the registry, overrides."""
