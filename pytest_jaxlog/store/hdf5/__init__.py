"""The HDF5 store, split by job. What enters: frames and attachments from the run; what leaves:
a file that is never wrong on its own, and the trajectory read back from it.

- ``layout``: every name the file holds, its constants and attribute helpers, and the provenance
  stored with each file;
- ``writer``: ``HDF5Writer``, the caller side: the sink a run writes through (hand-over,
  backpressure, errors);
- ``writer_thread``: the writer thread, which owns the h5py file, its groups and datasets, and
  its commits;
- ``journal``: commits (a rollback journal inside the file), the disk space claimed before HDF5
  writes, and the swap of a resumed file;
- ``guards``: what the world outside does to a file: a second writer (the path lock), a hung
  disk;
- ``parts``: a trajectory written by several processes;
- ``trajectory``: the reader, one interface for memory, file and multi-process parts;
- ``h5safe``: reading a file that may be hostile, and only the frames an index selects."""
