"""Layer 2, store: sinks consume frames (HDF5, memory, CSV, callback) and the trajectory reader
reads them back. Imports only ``record`` and ``errors``."""
