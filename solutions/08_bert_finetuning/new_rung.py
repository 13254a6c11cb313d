# Lesson 08, exercise 08-new-rung: a rung the ladder does not have yet.
from helpers import ladder

# fp16 autocast: the tensor-core rate of bf16 on GPUs that have fp16 units, at the price of a loss scaler
NEW_RUNG = ladder.Rung("+ fp16 autocast", "precision", "fp16",
                       "like bf16 on Volta+ GPUs, but needs a GradScaler (lesson 02)")
