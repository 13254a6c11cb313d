"""Plan a training run from a terminal (lessons 09, 10): the planner's table, its summary and its assumptions;
with --fit, the levers that make it fit on each class and why.

    python -m course.scripts.plan --model gpt2 --batch 8 --seq 1024 --gpus T4,A100-80,H100 --tokens 1e9
    python -m course.scripts.plan --fit --model qwen2.5-0.5b --batch 32 --seq 1024 --gpus T4,L4,8xH100
    python -m course.scripts.plan --help    # flags from transformers.HfArgumentParser, RunSpec's included
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from helpers.measure.levers import LEVERS
from helpers.measure.roofline import LAUNCH_S
from helpers.model.models import meta_model
from helpers.plan.fit import make_it_fit
from helpers.plan.planner import plan
from helpers.plan.report import EXAMPLE_PRICES, Prices
from helpers.train.runspec import flag_parser, spec_flags, spec_from_arguments

__all__ = ["PlanFlags", "main"]


def _flag(default: object, help_: str) -> Any:
    """A flag's default and its --help line (HfArgumentParser reads the field's metadata)."""
    return field(default=default, metadata={"help": help_})


@dataclass
class PlanFlags:
    """The planner's own flags, each with its --help line (its RunSpec switches come from
    helpers.train.runspec.spec_flags)."""

    model: str = _flag("bert-base",
                       "a name of helpers.model.models.KNOWN_MODELS, or an HF config.json / folder")
    batch: int = _flag(32, "sequences per step")
    seq: int = _flag(128, "tokens per sequence")
    gpus: str = _flag("", "comma-separated classes of helpers.measure.gpus (empty: every class)")
    tokens: float = _flag(0.0, "tokens in one epoch of the data set (0: no epoch rows)")
    prices: str = _flag("", "\"T4=0.35,A100-80=1.9\" USD per GPU-hour (empty: the dated example table)")
    prices_date: str = _flag("", "when your prices were read (with --prices)")
    launch_us: float = _flag(LAUNCH_S * 1e6, "µs per kernel launch (an assumption)")
    search: bool = _flag(True, "search the largest batch that fits (a few dry runs per class)")
    fit: bool = _flag(False,
                      "make it fit (lesson 10): --batch is the global batch, --gpus boxes such as 8xH100")
    allow: str = _flag("accumulation,checkpointing,sharding,offload",
                       "the levers --fit may pull (helpers.plan.fit)")
    objective: str = _flag("time", "--fit picks the fastest (\"time\") or the cheapest per epoch (\"cost\")")
    stack: str = _flag("eager",
                       "--fit: what the step runs as, for its expected time: eager, compiled or fused")


def _prices(text: str, date: str) -> Prices | None:
    if not text:
        return EXAMPLE_PRICES
    pairs = {}
    for part in text.split(","):
        key, _, value = part.partition("=")
        try:
            pairs[key.strip()] = float(value)
        except ValueError:
            raise ValueError(f"--prices {text!r}: write CLASS=USD pairs, e.g. T4=0.35,A100-80=1.9") from None
    return Prices(pairs, date or "not given", "given on the command line")


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m course.scripts.plan ...`: the plan's table in Markdown, then its assumptions (lesson 09)."""
    parser = flag_parser(PlanFlags, spec_flags(("fp8", "attn", "fused_adamw", "activation_checkpointing",
                                                "compile")),
                         description="Plan a training run on GPU classes you do not have (lesson 09).")
    try:
        own, switches = parser.parse_args_into_dataclasses(list(argv) if argv is not None else None,
                                                            look_for_args_file=False)
        spec = spec_from_arguments(switches)
        gpus = [g.strip() for g in own.gpus.split(",") if g.strip()] or None
        model = meta_model(own.model)
        if own.fit:
            return _fit(own, model, gpus or ["T4", "L4", "A100-80", "8xH100"])
        p = plan(model, (own.batch, own.seq), spec, gpus=gpus, dataset_tokens=own.tokens or None,
                 prices=_prices(own.prices, own.prices_date), launch_s=own.launch_us * 1e-6,
                 search=own.search)
    except ValueError as err:
        parser.error(str(err))
    print(p.to_markdown())
    print()
    print(p.summary())
    print()
    print(p.assumptions_text())
    print(f"\n(planned in {p.seconds:.1f} s on this machine's CPU; nothing ran on a GPU)")
    return 0


def _fit(own: PlanFlags, model: object, gpus: list[str]) -> int:
    allow = [a.strip() for a in own.allow.split(",") if a.strip()]
    f = make_it_fit(model, seq_len=own.seq, global_batch=own.batch, gpus=gpus, allow=allow,
                    objective=own.objective, stack=own.stack, prices=_prices(own.prices, own.prices_date),
                    dataset_tokens=own.tokens or None, launch_s=own.launch_us * 1e-6)
    print(f.table().to_markdown())
    print()
    for key in dict.fromkeys(o.gpu.key for o in f.options):
        print(f.why(key))
    print(f"\n(levers: {', '.join(LEVERS)}; fitted in {f.seconds:.1f} s on this machine's CPU)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

