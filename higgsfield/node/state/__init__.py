"""What a node keeps of a run: its record on disk, the pinned spec and placement, locks, and process identity.

The ground floor of the node side: every other part (runs, gang, runtime, code,
observe) reads and writes a run through it, and it imports none of them.
"""
