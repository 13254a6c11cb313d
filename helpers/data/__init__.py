"""Layer 2, what a model computes on: the corpus, tokenised splits and loaders, packing, a synthetic task.
Guide: docs/library/data.md"""
