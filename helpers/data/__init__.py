"""Layer 2, what a model computes on: the text corpus, tokenised splits and loaders, packing, a synthetic
task."""
