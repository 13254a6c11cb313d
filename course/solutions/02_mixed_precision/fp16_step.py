# Lesson 02, exercise 02-fp16-step: one fp16 training step with loss scaling and gradient clipping.
import torch


def fp16_step(model, batch, optimizer, scaler, device, max_norm=1.0):
    """One fp16 step: autocast forward and loss, scaled backward, unscale, clip, step, update; -> the loss."""
    optimizer.zero_grad(set_to_none=True)  # backward adds to .grad: start from nothing
    with torch.autocast(device_type=device.type, dtype=torch.float16):
        loss = model(**batch).loss  # forward and loss only
    scaler.scale(loss).backward()  # outside autocast; scaled so small gradients survive fp16
    scaler.unscale_(optimizer)  # the true gradients, before anything reads their size
    torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    scaler.step(optimizer)  # skipped if a gradient is inf or NaN
    scaler.update()  # halve the scale after an overflow, grow it after many clean steps
    return loss.detach()
