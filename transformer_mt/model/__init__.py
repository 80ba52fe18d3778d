"""The Transformer: its config, attention, parameter layout, size estimates."""
