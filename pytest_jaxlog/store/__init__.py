"""Layer 3, store: sinks consume frames (HDF5, memory, CSV, callback, dashboards) and the
trajectory reader reads them back. Imports only ``record`` and ``errors``.

- ``protocol``: the sink protocol, what every sink may use;
- ``sinks``: the sinks without a file format of their own;
- ``dashboards``: TensorBoard, Weights & Biases, MLflow;
- ``handover``: a writer's caller and its thread, bounded in bytes and in time;
- ``dtypes``: what storage does to dtypes and to a state's structure;
- ``manifest``: the session manifest, checked and merged;
- ``hdf5``: the HDF5 store (its own docstring says which module does which job)."""
