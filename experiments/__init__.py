"""Named experiments: one Python file per experiment, each with `get_config()`.

Files starting with "_" are shared building blocks, not experiments. `run.py list`
shows every experiment; `run.py train --experiment NAME` runs one.
"""
