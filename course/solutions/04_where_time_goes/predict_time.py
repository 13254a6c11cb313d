# Lesson 04, exercise 04-predict-time: an op's regime, and the time the roofline model gives it.


def predict_time(flops, bytes_moved, calls, peak_flops, bandwidth, overhead_s, synchronous):
    """-> (regime, seconds): the largest of the three times names the regime; the time adds the calls' cost
    to the work on a synchronous device (a CPU) and is the largest of the three on an asynchronous one
    (a GPU)."""
    times = {"compute": flops / peak_flops,  # the arithmetic at the peak rate
             "memory": bytes_moved / bandwidth,  # the traffic at the copy bandwidth
             "overhead": calls * overhead_s}  # the fixed cost of every call
    regime = max(times, key=times.get)
    work = max(times["compute"], times["memory"])  # compute and memory overlap inside a kernel
    seconds = times["overhead"] + work if synchronous else max(work, times["overhead"])
    return regime, seconds
