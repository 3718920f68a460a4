"""pytest plugin entry point (filled in by the plugin work). Imports no jax/h5py/perfetto."""
