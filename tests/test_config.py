import random

import numpy as np
import pytest
import torch
from fakegpu import fake_gpu

from course.profile import PROFILES, get_profile, pick
from helpers.core.seeding import seed_everything


def test_profile_from_environment(monkeypatch):
    monkeypatch.setenv("COURSE_PROFILE", "full")
    assert get_profile() == "full"
    monkeypatch.setenv("COURSE_PROFILE", "SMOKE")
    assert get_profile() == "smoke"


def test_unset_profile_follows_the_hardware(monkeypatch):
    monkeypatch.delenv("COURSE_PROFILE", raising=False)
    assert get_profile() == ("fit" if torch.cuda.is_available() else "smoke")
    assert get_profile("") == get_profile(None) == get_profile()
    fake_gpu(monkeypatch, "T4")
    assert get_profile() == "fit"  # a GPU's default: the full sizes fitted to it (course.sizing)


def test_a_lesson_s_profile_wins_over_the_environment(monkeypatch):
    # papermill's `-p PROFILE full` sets the parameters cell's value: the environment must not override it
    monkeypatch.setenv("COURSE_PROFILE", "smoke")
    assert get_profile("full") == "full" and get_profile(" FIT ") == "fit" and get_profile(None) == "smoke"
    with pytest.raises(ValueError, match="PROFILE must be one of"):
        get_profile(3)


def test_unknown_profile_lists_the_valid_ones(monkeypatch):
    monkeypatch.setenv("COURSE_PROFILE", "huge")
    with pytest.raises(ValueError) as err:
        get_profile()
    assert "huge" in str(err.value) and all(p in str(err.value) for p in PROFILES)


def test_pick():
    assert pick("smoke", smoke=1, full=2) == 1
    assert pick("full", smoke=1, full=2) == 2
    assert pick("fit", smoke=1, full=2) == 2  # the fit profile starts from the full sizes
    with pytest.raises(ValueError, match="medium"):
        pick("medium", smoke=1, full=2)


def test_seed_everything_repeats_every_generator():
    def draw():
        return random.random(), np.random.rand(), torch.rand(3)

    seed_everything(7)
    a = draw()
    seed_everything(7)
    b = draw()
    assert a[0] == b[0] and a[1] == b[1] and torch.equal(a[2], b[2])
    seed_everything(8)
    assert draw()[0] != a[0]


def test_hub_offline_is_read_in_one_place(monkeypatch):
    import socket

    from helpers.core import hub as config

    def no_network(*args, **kwargs):
        raise AssertionError("HF_HUB_OFFLINE is set: no connection may be attempted")

    monkeypatch.setattr(socket, "create_connection", no_network)
    for value in ("1", "true", "YES", " on "):
        monkeypatch.setenv("HF_HUB_OFFLINE", value)
        assert config.hub_offline() and not config.hub_reachable()
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    assert not config.hub_offline()
