"""A lesson's set-up is frozen: a cell changes it only by making a changed copy, and a name it lacks is an
error that lists what it has."""

from __future__ import annotations

import pytest
import torch

from course.lessons import LessonSetup
from course.sizing import Size, fit_sizes


@pytest.fixture
def setup() -> LessonSetup:
    fit = fit_sizes({"SEQ": Size(full=512, smoke=64)}, {"a step": lambda sizes: 2**20}, shrink=[],
                    profile="smoke", device="cpu")
    return LessonSetup(PROFILE=fit.profile, DEVICE=torch.device("cpu"), FIT=fit, **fit.sizes, BATCH=4)


def test_the_set_up_is_frozen_and_replace_makes_a_changed_copy(setup):
    with pytest.raises(AttributeError, match=r"frozen.*S = S.replace\(SEQ=\.\.\.\)"):
        setup.SEQ = 128
    with pytest.raises(AttributeError, match="frozen"):
        del setup.BATCH
    longer = setup.replace(SEQ=2 * setup.SEQ)
    assert (longer.SEQ, setup.SEQ) == (128, 64) and longer.BATCH == setup.BATCH and longer != setup
    assert setup.replace() == setup and setup.get("SEQ") == 64 and setup.get("NOPE", 1) == 1


def test_a_name_the_set_up_lacks_says_what_it_has(setup):
    with pytest.raises(AttributeError, match="has no 'SEQ_LEN'; it has BATCH, DEVICE, FIT, PROFILE, SEQ"):
        setup.SEQ_LEN
    with pytest.raises(AttributeError, match=r"has no \['SEQ_LEN'\]"):
        setup.replace(SEQ_LEN=8)
    assert not hasattr(setup, "__wrapped__")  # dunder lookups (copy, inspect) see a plain AttributeError


def test_a_set_up_needs_its_common_fields_and_upper_case_names(setup):
    with pytest.raises(TypeError, match=r"missing \['FIT'\]"):
        LessonSetup(PROFILE="smoke", DEVICE=torch.device("cpu"))
    with pytest.raises(TypeError, match=r"upper-case names only \(got \['batch'\]\)"):
        LessonSetup(**vars(setup), batch=4)
