# Lesson 08, exercise 08-greedy-climb: the greedy ladder, its keep rule included.


def greedy_climb(baseline, rungs, time_side_by_side):
    """Each rung on the best stack so far, kept when faster than that stack beyond the noise of both timings;
    -> (the final stack, [kept?, one per rung])."""
    best, kept = baseline, []
    for rung in rungs:
        candidate = rung.on(best)  # the rung added to what has paid so far
        t_cand, t_best = time_side_by_side(candidate, best)  # one session: the machine's load falls on both
        ratio = t_best.median_s / t_cand.median_s  # > 1: the candidate is faster
        spread = max(t_cand.iqr_s / t_cand.median_s, t_best.iqr_s / t_best.median_s)  # relative noise
        keep = ratio > 1 + spread
        kept.append(keep)
        if keep:
            best = candidate
    return best, kept
