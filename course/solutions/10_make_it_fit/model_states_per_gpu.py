# Lesson 10, exercise 10-model-states: the bytes of weights, gradients and AdamW's state on each GPU.

BYTES = {"weights": 4, "gradients": 4, "optimizer state": 8}  # fp32; AdamW keeps two moments per weight
SHARDED = {"none": (), "optimizer": ("optimizer state",), "full": ("weights", "gradients", "optimizer state")}


def model_states_per_gpu(parameters, gpus, sharding):
    """-> {"weights", "gradients", "optimizer state"}: bytes per GPU. DDP ("none") keeps all on every GPU,
    ZeRO-1 ("optimizer") splits the state, FSDP2 ("full") splits all three; a shard is ceil(parameters /
    gpus) parameters, the last one padded."""
    shard = -(-parameters // gpus)  # rounded up: integer arithmetic, exact for any size
    return {part: size * (shard if part in SHARDED[sharding] else parameters) for part, size in BYTES.items()}
