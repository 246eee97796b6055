"""reflexarc."""
