# Lesson 09, exercise 09-largest-batch: the largest batch that fits a GPU, from two dry runs.
import math


def largest_batch_from(batch, peak_at_batch, peak_at_double, memory_bytes, margin):
    """-> the largest whole batch whose step fits memory_bytes less the margin (0 if none does): the second
    dry run adds `batch` samples, so their difference is the bytes per sample; the rest of the first is
    fixed."""
    per_sample = (peak_at_double - peak_at_batch) / batch  # activations: grow with every sample
    fixed = peak_at_batch - batch * per_sample  # weights, gradients, AdamW's moments: do not grow
    usable = memory_bytes * (1 - margin)  # the margin stays free
    return max(0, math.floor((usable - fixed) / per_sample))
