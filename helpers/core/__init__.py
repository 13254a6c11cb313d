"""Layer 0, what every other layer stands on: version differences (`compat`), timing, the device and its
report, precision switches, diagnosis of a broken set-up, your own model's adapter, seeding, hub access,
byte units."""
