"""Layer 5, a run planned on GPUs you do not have: fits or not, step time, tokens/s and cost (lesson 09)."""
