"""The course's scripts that run as their own processes (torchrun): `python -m helpers.scripts.train_ddp`,
or by path from `helpers.paths.script("train_ddp")` (lessons 07, 08)."""
