"""Layer 1, numbers about a run: the roofline and GPU facts, FLOPs and MFU, memory (measured and from a dry
run), a step's ops counted and timed, where the time goes, agreement of a faster variant."""
