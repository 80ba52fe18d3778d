"""Processes, devices and files: errors, multi-process setup, the mesh, the compile cache."""
