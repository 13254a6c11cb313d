# Lesson 04, exercise 04-predict-time: an op's time and its regime, from the roofline and the overhead.


def predict_time(flops, bytes_moved, peak_flops, bandwidth, overhead_s):
    """-> (regime, seconds): the slowest of compute, memory traffic and the fixed overhead sets the time."""
    times = {"compute-bound": flops / peak_flops, "memory-bound": bytes_moved / bandwidth,
             "overhead-bound": overhead_s}
    regime = max(times, key=times.get)
    return regime, times[regime]
