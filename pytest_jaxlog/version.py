"""The package's version, in the bottom layer: the store writes it into every file it makes, and a
layer may import only from below it (the package itself, whose ``__init__`` re-exports this,
is the top)."""

__version__ = "0.1.0"
