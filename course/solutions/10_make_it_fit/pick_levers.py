# Lesson 10, exercise 10-pick-levers: the cheapest levers that fit a step in a GPU's memory budget.

# (sharded, checkpointing), the cheapest first: a sharded step gathers weights, a checkpointed one recomputes
ORDER = ((False, False), (True, False), (False, True), (True, True))


def pick_levers(model_states, per_sequence, batch, gpus, budget):
    """-> {"sharded", "checkpointing", "micro_batch"} of the first combination in ORDER that fits `budget`
    bytes, with the largest micro-batch that divides each GPU's share of the batch; None when none fits."""
    per_gpu = batch // gpus  # data parallel: each GPU its share of the batch
    for sharded, checkpointing in ORDER:
        held = model_states / gpus if sharded else model_states  # FSDP2 splits all of it over the GPUs
        activations = per_sequence["checkpointed" if checkpointing else "plain"]  # bytes one sequence keeps
        for micro in range(per_gpu, 0, -1):  # the largest micro-batch first: the fewest passes
            if per_gpu % micro == 0 and held + micro * activations <= budget:
                return {"sharded": sharded, "checkpointing": checkpointing, "micro_batch": micro}
    return None
