"""The small Llama whose levers lesson 10 measures (and tests/test_levers.py), and the script it launches
under torchrun: each rank trains two steps with FSDP2 (`helpers.train.distributed.apply_fsdp`), then again
with CPU offload, through `helpers.train.loop.train`, whose CPU reading of the second step is the peak
measured; each rank writes its numbers to <out>/rank<r>.json.

    torchrun --nproc_per_node=2 -m course.scripts.fsdp_levers --out DIR
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

# at the top, not in small_llama: lesson 10 builds it under torch.device("meta"), where transformers 4.52
# cannot import a model's module
from transformers import LlamaConfig, LlamaForCausalLM

VOCAB, WIDTH, LAYERS, HEADS = 1024, 128, 2, 4  # a Llama small enough to measure in a second
ROWS, SEQ = 4, 64  # one micro-batch


def small_llama(seed: int = 0) -> torch.nn.Module:
    """The Llama every lever is measured on (random weights, eager attention, fp32) (lesson 10)."""
    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=WIDTH, intermediate_size=344, num_hidden_layers=LAYERS,
                      num_attention_heads=HEADS, num_key_value_heads=HEADS, max_position_embeddings=SEQ,
                      attn_implementation="eager",
                      use_cache=False)  # training: no key/value cache (checkpointing refuses one)
    return LlamaForCausalLM(cfg)


def batch(seed: int = 0, rows: int = ROWS) -> dict[str, torch.Tensor]:
    """A language-model micro-batch: token ids and the same ids as labels (lesson 10)."""
    ids = torch.randint(0, VOCAB, (rows, SEQ), generator=torch.Generator().manual_seed(seed))
    return {"input_ids": ids, "labels": ids.clone()}


def main() -> None:
    """Train the small Llama with FSDP2, then with offload, and write this rank's peaks (lesson 10)."""
    from helpers.measure.memory import tensor_bytes
    from helpers.train import distributed
    from helpers.train.loop import TrainConfig, make_optimizer, train

    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    out = Path(parser.parse_args().out)
    env = distributed.setup("cpu")
    numbers = {"world": env.world_size}
    for name, offload in (("sharded", False), ("offload", True)):
        model = small_llama()
        model = distributed.apply_fsdp(model, env, model.model.layers, offload=offload)
        opt = make_optimizer(model, 1e-3, 0.0)
        result = train(model, [batch(seed=env.rank)], TrainConfig(steps=2, progress=False, peak_flops=1e11),
                       optimizer=opt)
        # what FSDP2 keeps between steps: this rank's shards, their gradients, the optimizer state
        numbers[name] = {"peak": result.peak_memory_bytes, "kept": tensor_bytes(model, opt),
                         "method": result.memory_method}
        del model, opt
    (out / f"rank{env.rank}.json").write_text(json.dumps(numbers))
    distributed.teardown()


if __name__ == "__main__":
    main()
