"""Layer 3, what computes: attention (naive, tiled, SDPA), the Triton kernels, the small Transformer and BERT,
FP8 linears, a classifier on packed batches."""
