"""Layer 1, numbers about a run: roofs and GPU facts, FLOPs and MFU, memory, a step's ops and their time."""
