# Lesson 08, exercise 08-keep-rule: the greedy ladder keeps a rung only when it pays beyond the noise.


def keep_rung(candidate, best):
    """Keep the candidate (a helpers.timing.Timing) when it is faster than the best stack beyond the noise."""
    ratio = best.median_s / candidate.median_s  # > 1: the candidate is faster
    spread = max(candidate.iqr_s / candidate.median_s, best.iqr_s / best.median_s)  # relative noise
    return ratio > 1 + spread
