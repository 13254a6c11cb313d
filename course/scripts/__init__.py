"""The course's scripts that run as their own processes (torchrun): `python -m course.scripts.train_ddp`,
or by path from `course.paths.script("train_ddp")` (lessons 07, 08)."""
