# Lesson 07, exercise 07-bucketed-allreduce: DDP's core, gradients averaged in buckets during backward.
import torch
import torch.distributed as dist


def attach_grad_allreduce(model, bucket_cap_bytes):
    """Average gradients over the processes in buckets, each all-reduced as soon as it is full, while
    backward goes on; -> finish(), to call after backward: reduces the last bucket, waits, writes back."""
    world = dist.get_world_size()
    bucket, size, pending = [], 0, []  # the bucket being filled; in flight: (handle, flat, params)

    def flush():
        nonlocal bucket, size
        if bucket:
            flat = torch.cat([p.grad.flatten() for p in bucket])  # one message for the whole bucket
            pending.append((dist.all_reduce(flat, async_op=True), flat, bucket))  # returns at once
            bucket, size = [], 0

    def on_grad_ready(param):  # called by autograd when param.grad has been accumulated
        nonlocal size
        bucket.append(param)
        size += param.grad.numel() * param.grad.element_size()
        if size >= bucket_cap_bytes:
            flush()

    for p in model.parameters():
        if p.requires_grad:
            p.register_post_accumulate_grad_hook(on_grad_ready)

    def finish():
        flush()  # the last bucket, which never filled up
        for handle, flat, params in pending:
            handle.wait()
            flat /= world  # all_reduce sums: the average is the sum over the world size
            offset = 0
            for p in params:
                p.grad.copy_(flat[offset:offset + p.numel()].view_as(p.grad))
                offset += p.numel()
        pending.clear()

    return finish
