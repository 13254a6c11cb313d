# Lesson 00, exercise 00-roofline: FLOPs, bytes, arithmetic intensity and regime of three ops.
BYTES = 4  # one fp32 element


def intensity_and_regime(op, n, roof):
    """-> (FLOPs, bytes moved, FLOP per byte, "compute-bound" or "memory-bound") of `op` at size n (fp32)."""
    if op == "matmul":  # (n, n) @ (n, n): n² outputs, each n multiply-adds
        flops, elements = 2 * n ** 3, 3 * n * n  # read A and B, write C
    elif op == "add":  # x + y, n elements each
        flops, elements = n, 3 * n  # read x and y, write the sum
    elif op == "matvec":  # (n, n) @ (n,): n outputs, each n multiply-adds
        flops, elements = 2 * n * n, n * n + 2 * n  # read the matrix and the vector, write the result
    else:
        raise ValueError(f"unknown op {op!r}")
    bytes_moved = elements * BYTES
    intensity = flops / bytes_moved
    ridge = roof.matmul_flops["fp32"] / roof.bandwidth  # FLOP per byte where the two roofs meet
    return flops, bytes_moved, intensity, "compute-bound" if intensity >= ridge else "memory-bound"
