# Lesson 03, exercise 03-largest-batch: the largest batch that fits, surviving out-of-memory errors.
import gc

import torch


def largest_batch(step_fn, limit):
    """The largest n <= limit for which step_fn(n) runs without running out of memory; 0 if 1 does not fit."""

    def fits(n):
        try:
            step_fn(n)
            return True
        except torch.cuda.OutOfMemoryError:
            pass  # the exception (and its traceback, which holds the failed step's tensors) ends here
        gc.collect()  # the failed step's tensors may sit in reference cycles
        if torch.cuda.is_available():
            torch.cuda.empty_cache()  # hand the cached blocks back before the next try
        return False

    good, n = 0, 1
    while n <= limit and fits(n):  # double while it fits
        good, n = n, n * 2
    if good == 0:
        return 0
    bad = n
    if n > limit:  # doubling passed the limit without a failure
        if good == limit or fits(limit):
            return limit
        bad = limit
    while bad - good > 1:  # bisect: good fits, bad does not
        mid = (good + bad) // 2
        if fits(mid):
            good = mid
        else:
            bad = mid
    return good
