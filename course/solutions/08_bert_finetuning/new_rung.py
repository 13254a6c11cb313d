# Lesson 08, exercise 08-new-rung: a rung the ladder does not have yet, measured by the check.
from helpers.train import ladder

# activation checkpointing (lesson 03): each block's activations recomputed in the backward pass
NEW_RUNG = ladder.Rung("+ activation checkpointing", "activation_checkpointing", True,
                       "much less activation memory for about 1.3x the step time (lesson 03)")
