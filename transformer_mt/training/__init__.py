"""The train step, the loop, resuming, fine-tuning, sweeps, paper reproduction."""
