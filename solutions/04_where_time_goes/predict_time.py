# Lesson 04, exercise 04-predict-time: an op's regime, and the time the roofline model says it needs at least.


def predict_time(flops, bytes_moved, peak_flops, bandwidth, overhead_s):
    """-> (regime, seconds): "compute", "memory" or "overhead", whichever of the three times is largest."""
    times = {"compute": flops / peak_flops,  # the arithmetic at the peak rate
             "memory": bytes_moved / bandwidth,  # the traffic at the copy bandwidth
             "overhead": overhead_s}  # the fixed cost of one call
    regime = max(times, key=times.get)
    return regime, times[regime]
