"""Layer 4, a training run: its switches (`runspec`), the loop, meters, checkpoints, evaluation, DDP/FSDP,
and lesson 08's ladder."""
