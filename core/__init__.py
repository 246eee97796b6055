"""reflexarc's bottom layer: the vocabulary every other layer shares.

Imports nothing of the project; ``bpf``, ``actuators``, ``simulations`` and
``controller`` all import it.
"""
