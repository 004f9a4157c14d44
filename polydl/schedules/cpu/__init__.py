"""The CPU schedule: loop orders, tiles, parallel loops and microkernel bindings for the C target."""
