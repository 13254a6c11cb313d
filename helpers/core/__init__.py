"""Layer 0, what every other layer stands on: version differences, timing, the device, precision, diagnosis,
your own model's adapter, seeding, hub access, byte units. Guide: docs/library/core.md"""
