"""`helpers.train.loop.train` on an FSDP2 model under torchrun, a rank killed, the job restarted (issue 39,
point 1). tests/test_train.py runs it as
`torchrun --nproc-per-node=2 --max-restarts=2 tests/fsdp_resume.py OUT`.

Two models, one after the other: a vocabulary of 64 (every parameter splits evenly over 2 ranks) and of
65 (the embedding and head split 33 / 32). For each: the run with a checkpoint every EVERY steps in which
rank 1 SIGKILLs itself after step KILL_AFTER; torchrun restarts both ranks, and the run resumes from its
newest checkpoint; then the same run uninterrupted. Attempt 0 kills the even run, attempt 1 the uneven
one, attempt 2 finishes. Rank 0 writes, per model, the largest |resumed - uninterrupted| of the final full
weights, both loss curves, the step the run resumed from and the checkpoint folder's names to OUT (JSON).
"""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path

import torch
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

from helpers.data.synthetic import synthetic_batch_fn
from helpers.model.models import SmallTransformer, TransformerConfig
from helpers.train.distributed import apply_fsdp, setup, teardown
from helpers.train.loop import TrainConfig, train

STEPS, EVERY, KILL_AFTER = 6, 2, 3  # checkpoints after steps 2, 4, 6; rank 1 dies after step 3


def model(vocab: int, env) -> torch.nn.Module:  # noqa: ANN001 - a DistEnv
    torch.manual_seed(0)  # the same initial weights on every rank, in every attempt
    cfg = TransformerConfig(vocab_size=vocab, max_len=8, d_model=16, n_heads=2, n_layers=1, d_ff=32,
                            dropout=0.1)  # dropout: the resumed run must draw the masks the lost one drew
    return apply_fsdp(SmallTransformer(cfg), env)


def run(vocab: int, env, folder: Path | None,  # noqa: ANN001 - a DistEnv
        kill: bool) -> tuple[list[float], dict[str, torch.Tensor], int]:
    batches = synthetic_batch_fn(vocab, 2, 8, seed=env.rank)  # each rank its own data

    def on_step(done: int, out) -> None:  # noqa: ANN001
        if kill and done == KILL_AFTER and env.rank == 1:
            print(f"rank 1: killed after step {done}", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)

    m = model(vocab, env)
    cfg = TrainConfig(steps=STEPS, lr=1e-2, progress=False, track_memory=False, peak_flops=1e9,
                      checkpoint_dir=str(folder) if folder else None, checkpoint_every=EVERY if folder else 0)
    result = train(m, batches, cfg, env.device, on_step=on_step)
    full = get_model_state_dict(m, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    return result.losses, full, result.resumed_from or 0


def main() -> None:
    out = Path(sys.argv[1])
    env = setup("cpu")
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    report = json.loads(out.read_text()) if out.exists() else {}
    for i, (name, vocab) in enumerate((("even", 64), ("uneven", 65))):
        if name in report:
            continue
        folder = out.parent / f"ckpt-{name}"
        resumed_losses, resumed, resumed_from = run(vocab, env, folder, kill=attempt == i)
        losses, reference, _ = run(vocab, env, None, kill=False)
        if env.is_main:  # the full weights are gathered on rank 0 (cpu_offload)
            diff = max(float((resumed[k] - reference[k]).abs().max()) for k in reference)
            report[name] = {"max_abs_diff": diff, "losses": losses, "resumed_losses": resumed_losses,
                            "resumed_from": resumed_from, "attempt": attempt,
                            "folder": sorted(p.name for p in folder.iterdir())}
            out.write_text(json.dumps(report))
        torch.distributed.barrier()
        report = json.loads(out.read_text())
    teardown()


if __name__ == "__main__":
    main()
